/*
 * xport — the public ect_xport_* calls: options, dispatch to a back end by
 * name, argument checks shared by every back end, and the target's region
 * table. A region is looked up by its 64-bit token; a write takes a
 * reference for as long as bytes may still land in it, and unregister first
 * hides the region (so no new write can take it) and then waits for the
 * references to drain. That ordering is what makes "never free memory while a
 * remote write may be in flight" hold for tcp and shm.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include "mem/cuda.h"
#include "mem/memkind.h"
#include "util/keys.h"
#include "util/util.h"
#include "xport/auth.h"
#include "xport/xport.h"

/* "%016" PRIx64 of v into out[17], without the format machinery (a window is
 * opened per small item: issue 13). */
static void hex16(char out[17], uint64_t v) {
    static const char hex[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--, v >>= 4) out[i] = hex[v & 15];
    out[16] = '\0';
}

static const xp_backend *const backends[] = {
    &xp_tcp_backend,
    &xp_shm_backend,
#if ECT_HAVE_UCX
    &xp_ucx_backend,
#endif
};

void ect_xport_opts_init(ect_xport_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->listen = "127.0.0.1:0";
    o->conns_per_peer = 2;
    o->stripe_min = 1u << 20;
    o->connect_timeout_ms = 5000;
    o->io_timeout_ms = 30000;
    o->max_conns = 512;
    o->max_conns_per_peer = 64;
}

static int check_opts(const ect_xport_opts *o) {
    if (!o->listen || !o->listen[0] || strlen(o->listen) >= 256)
        return ect_set_error(ECT_EINVAL, "opts.listen must be a HOST:PORT string under 256 bytes");
    if (o->conns_per_peer < 1 || o->conns_per_peer > 64)
        return ect_set_error(ECT_EINVAL, "opts.conns_per_peer must be 1..64, got %d",
                             o->conns_per_peer);
    if (o->stripe_min < 4096 || o->stripe_min > (1ull << 40))
        return ect_set_error(ECT_EINVAL, "opts.stripe_min must be 4096..2^40 bytes, got %" PRIu64,
                             o->stripe_min);
    if (o->connect_timeout_ms < 1 || o->connect_timeout_ms > 600000)
        return ect_set_error(ECT_EINVAL, "opts.connect_timeout_ms must be 1..600000, got %d",
                             o->connect_timeout_ms);
    if (o->io_timeout_ms < 1 || o->io_timeout_ms > 3600000)
        return ect_set_error(ECT_EINVAL, "opts.io_timeout_ms must be 1..3600000, got %d",
                             o->io_timeout_ms);
    if (o->max_conns < 1 || o->max_conns > 65536)
        return ect_set_error(ECT_EINVAL, "opts.max_conns must be 1..65536, got %d", o->max_conns);
    if (o->max_conns_per_peer < 1 || o->max_conns_per_peer > o->max_conns)
        return ect_set_error(ECT_EINVAL,
                             "opts.max_conns_per_peer must be 1..max_conns (%d), got %d",
                             o->max_conns, o->max_conns_per_peer);
    return 0;
}

/* The back end named kind and the checked options (defaults where opts is
 * NULL) for a transport with keys (keyed) or without. */
static int open_check(const char *kind, const ect_xport_opts *opts, bool keyed,
                      const xp_backend **be_out, ect_xport_opts *o) {
    if (!kind) return ect_set_error(ECT_EINVAL, "kind must be \"tcp\", \"shm\" or \"ucx\"");
    const xp_backend *be = NULL;
    for (size_t i = 0; i < ECT_ARRAY_LEN(backends); i++)
        if (strcmp(kind, backends[i]->name) == 0) be = backends[i];
    if (!be) {
        if (strcmp(kind, "ucx") == 0)
            return ect_set_error(ECT_ENOTSUP, "kind \"ucx\": this build has no UCX transport");
        return ect_set_error(ECT_EINVAL, "kind \"%s\" is not a transport (tcp, shm%s)", kind,
                             ECT_HAVE_UCX ? ", ucx" : "");
    }
    ect_xport_opts_init(o);
    if (opts) *o = *opts;
    int rc = check_opts(o);
    if (rc) return rc;
    if (keyed) {
        /* ucx moves bytes with one-sided puts that no handshake of ours can
         * guard: refusing beats a silently unauthenticated data plane. */
        if (strcmp(be->name, "ucx") == 0)
            return ect_set_error(ECT_ENOTSUP,
                                 "opts.curve_keys: the ucx transport cannot authenticate its "
                                 "peers; use tcp or shm with keys, or turn keys off");
        if ((rc = xp_auth_init()) != 0) return rc;
    }
    *be_out = be;
    return 0;
}

/* Opens be with checked options o and keys, a reference this call takes
 * over (dropped on failure; NULL: keys off). */
static int open_backend(const xp_backend *be, const ect_xport_opts *o, ect_keyset *keys,
                        ect_xport **out) {
    ect_xport *x = calloc(1, sizeof *x);
    if (!x) {
        ect_keys_free(keys);
        return ect_set_error(ECT_ENOMEM, "transport handle");
    }
    x->be = be;
    x->opts = *o;
    x->keys = keys;
    x->opts.curve_keys = keys ? keys->dir : NULL;
    snprintf(x->listen, sizeof x->listen, "%s", o->listen);
    x->opts.listen = x->listen;
    pthread_mutex_init(&x->regs.mu, NULL);
    pthread_cond_init(&x->regs.cv, NULL);
    x->regs.next_id = 1;
    x->regs.owner = x;
    x->regs.spare_wins = ECT_SPARES_INIT(xp_region, next_dead, XP_SPARE_WINDOWS);
    int rc = be->open(x);
    if (rc) {
        pthread_mutex_destroy(&x->regs.mu);
        pthread_cond_destroy(&x->regs.cv);
        ect_keys_free(x->keys);
        free(x);
        return rc;
    }
    ECT_LOGI("xport", "%s transport open, session %s%s", be->name, x->session,
             x->keys ? ", peers authenticated with data-plane keys" : "");
    *out = x;
    return 0;
}

int ect_xport_open(const char *kind, const ect_xport_opts *opts, ect_xport **out) {
    if (!out) return ect_set_error(ECT_EINVAL, "out must not be NULL");
    *out = NULL;
    const xp_backend *be = NULL;
    ect_xport_opts o;
    int rc = open_check(kind, opts, opts && opts->curve_keys, &be, &o);
    if (rc) return rc;
    ect_keyset *keys = NULL;
    if (o.curve_keys && (rc = ect_keys_load(o.curve_keys, &keys)) != 0)
        return ect_set_error(rc, "opts.curve_keys: %s", ect_last_error());
    return open_backend(be, &o, keys, out);
}

int xp_open_keyed(const char *kind, const ect_xport_opts *opts, ect_keyset *keys, ect_xport **out) {
    if (!out) return ect_set_error(ECT_EINVAL, "out must not be NULL");
    *out = NULL;
    const xp_backend *be = NULL;
    ect_xport_opts o;
    int rc = open_check(kind, opts, keys != NULL, &be, &o);
    if (rc) return rc;
    return open_backend(be, &o, ect_keys_ref(keys), out);
}

const char *ect_xport_kind(const ect_xport *x) { return x ? x->be->name : ""; }

const char *ect_xport_session(const ect_xport *x) { return x ? x->session : ""; }

static void region_key_free(xp_region *r) {
    if (r->keystr != r->keybuf) free(r->keystr);
    r->keystr = NULL;
}

void xp_region_key_replace(xp_region *r, char *ks) {
    region_key_free(r);
    r->keystr = ks;
}

int xp_key_parse(const char *s, uint64_t *token) {
    uint64_t v = 0;
    size_t i = 0;
    for (; s[i] && i < 17; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) break;
        v = (v << 4) | (uint64_t)d;
    }
    if (i != 16 || s[16] != '\0')
        return ect_set_error(ECT_EINVAL,
                             "dst_key '%.40s' is not a key of this transport (16 hex digits)", s);
    *token = v;
    return 0;
}

int ect_xport_register(ect_xport *x, void *addr, uint64_t len, int fd, uint64_t fd_offset,
                       char key[ECT_XPORT_KEY_MAX]) {
    return ect_xport_register_mem(x, addr, len, ECT_MEM_HOST, fd, fd_offset, key);
}

/* What the region is, asked of mem: *kind and *dev. ECT_EINVAL when the
 * caller's kind contradicts it; ECT_ENOTSUP for a CUDA region the back end
 * cannot serve, or pinned/CUDA without the driver. */
static int region_kind(ect_xport *x, void *addr, int want, int *kind, int *dev) {
    *dev = 0;
    if (want != ECT_MEM_AUTO && want != ECT_MEM_HOST && want != ECT_MEM_PINNED &&
        want != ECT_MEM_CUDA)
        return ect_set_error(ECT_EINVAL, "mem_kind %d is not a memory kind", want);
    int is;
    ect_mem_kind_of(addr, &is, dev); /* host, without asking, when no driver is loaded */
    if (want == ECT_MEM_HOST && is == ECT_MEM_CUDA)
        return ect_set_error(ECT_EINVAL,
                             "addr %p is CUDA device memory: register it as ECT_MEM_CUDA", addr);
    if (want == ECT_MEM_HOST || want == ECT_MEM_AUTO) want = is;
    if (want == ECT_MEM_CUDA && is != ECT_MEM_CUDA) {
        ect_cuda_info ci;
        if (ect_cuda_get_info(&ci) != 0)
            return ect_set_error(ECT_ENOTSUP, "a CUDA region needs the CUDA driver: %s", ci.why);
        return ect_set_error(ECT_EINVAL, "addr %p is not CUDA device memory (it is %s memory)",
                             addr, ect_mem_kind_name(is));
    }
    if (want == ECT_MEM_PINNED && is != ECT_MEM_PINNED) {
        ect_cuda_info ci;
        if (ect_cuda_get_info(&ci) != 0)
            return ect_set_error(ECT_ENOTSUP, "pinned memory needs the CUDA driver: %s", ci.why);
        return ect_set_error(ECT_EINVAL,
                             "addr %p is not pinned (registered) host memory (it is %s)", addr,
                             ect_mem_kind_name(is));
    }
    if (want == ECT_MEM_CUDA && !x->be->device_regions)
        return ect_set_error(ECT_ENOTSUP,
                             "the %s transport cannot receive into CUDA device memory (use tcp "
                             "or shm)",
                             x->be->name);
    *kind = want;
    return 0;
}

int ect_xport_register_mem(ect_xport *x, void *addr, uint64_t len, int mem_kind, int fd,
                           uint64_t fd_offset, char key[ECT_XPORT_KEY_MAX]) {
    if (!x || !key) return ect_set_error(ECT_EINVAL, "x and key must not be NULL");
    key[0] = '\0';
    uint64_t end;
    if (!addr) return ect_set_error(ECT_EINVAL, "addr must not be NULL");
    if (len == 0) return ect_set_error(ECT_EINVAL, "len must be at least 1");
    if (!ect_add_u64((uint64_t)(uintptr_t)addr, len, &end))
        return ect_set_error(ECT_EOVERFLOW, "addr + len overflows");
    if (fd < -1) return ect_set_error(ECT_EINVAL, "fd must be a descriptor or -1, got %d", fd);
    int kind = ECT_MEM_HOST, dev = 0;
    int krc = region_kind(x, addr, mem_kind, &kind, &dev);
    if (krc) return krc;
    if (kind == ECT_MEM_CUDA && fd >= 0)
        return ect_set_error(ECT_EINVAL, "a CUDA region has no fd (pass -1)");
    if (fd >= 0) {
        struct stat st;
        uint64_t fend;
        if (fstat(fd, &st) != 0) return ect_set_errno(errno, "fd %d", fd);
        if (!ect_add_u64(fd_offset, len, &fend) || (uint64_t)st.st_size < fend)
            return ect_set_error(ECT_ERANGE,
                                 "fd_offset + len (%" PRIu64 " + %" PRIu64
                                 ") exceeds the fd's size %lld",
                                 fd_offset, len, (long long)st.st_size);
    } else if (strcmp(x->be->name, "shm") == 0 && kind != ECT_MEM_CUDA) {
        return ect_set_error(ECT_ENOTSUP, "shm needs a host region backed by an fd (memfd or "
                                          "/dev/shm), or CUDA device memory");
    }
    xp_region *r = calloc(1, sizeof *r);
    if (!r) return ect_set_error(ECT_ENOMEM, "region");
    r->addr = addr;
    r->len = len;
    r->kind = kind;
    r->device = dev;
    r->fd = -1;
    r->fd_off = fd_offset;
    if (fd >= 0 && (r->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        free(r);
        return ect_set_errno(errno, "dup of fd %d", fd);
    }
    r->keystr = r->keybuf;
    pthread_mutex_lock(&x->regs.mu);
    xp_region *o, *tmp, *found;
    int rc = 0;
    HASH_ITER(hh, x->regs.by_token, o, tmp) {
        if (!o->parent && (uint64_t)(uintptr_t)o->addr < end &&
            (uint64_t)(uintptr_t)addr < (uint64_t)(uintptr_t)o->addr + o->len) {
            rc = ect_set_error(ECT_EEXIST, "region [%p, +%" PRIu64 ") overlaps a registered one",
                               addr, len);
            break;
        }
    }
    if (!rc) {
        do {
            r->token = ect_random_u64();
            HASH_FIND(hh, x->regs.by_token, &r->token, sizeof r->token, found);
        } while (found || r->token == 0);
        r->id = x->regs.next_id++;
    }
    pthread_mutex_unlock(&x->regs.mu);
    snprintf(r->keystr, 17, "%016" PRIx64, r->token);
    if (!rc && x->be->reg) rc = x->be->reg(x, r);
    if (rc) {
        if (r->fd >= 0) close(r->fd);
        region_key_free(r);
        free(r);
        return rc;
    }
    /* The overlap check and the insert are two steps; recheck under the lock
     * so two racing registers of the same memory cannot both win. */
    pthread_mutex_lock(&x->regs.mu);
    HASH_ITER(hh, x->regs.by_token, o, tmp) {
        if (!o->parent && (uint64_t)(uintptr_t)o->addr < end &&
            (uint64_t)(uintptr_t)addr < (uint64_t)(uintptr_t)o->addr + o->len)
            rc = ECT_EEXIST;
    }
    if (!rc) HASH_ADD(hh, x->regs.by_token, token, sizeof r->token, r);
    pthread_mutex_unlock(&x->regs.mu);
    if (rc) {
        if (x->be->unreg) x->be->unreg(x, r);
        if (r->fd >= 0) close(r->fd);
        region_key_free(r);
        free(r);
        return ect_set_error(ECT_EEXIST, "region [%p, +%" PRIu64 ") overlaps a registered one",
                             addr, len);
    }
    snprintf(key, ECT_XPORT_KEY_MAX, "%s", r->keystr);
    return 0;
}

int xp_window_close(ect_xport *x, const char *key);

/* Takes r out of the table by token and logs its id as gone. regs.mu held. */
static void region_unlink(xp_regions *t, xp_region *r) {
    HASH_DEL(t->by_token, r);
    t->gone[t->gone_seq++ % XP_GONE_LOG] = r->id;
}

/* Releases what r holds but its entry: the back end's state, its key, and
 * for a region its window index and its fd (a window borrows its region's). */
static void region_undo(ect_xport *x, xp_region *r) {
    if (x->be->unreg) x->be->unreg(x, r);
    free(r->wins); /* a region's window index (its windows are gone or going) */
    if (r->fd >= 0 && !r->parent) close(r->fd);
    region_key_free(r);
}

static void region_free(ect_xport *x, xp_region *r) {
    region_undo(x, r);
    free(r);
}

/* Frees the closed windows on the list `ws` (linked by next_dead, nothing
 * references them): undone outside the lock, their entries then kept as
 * spares for the next opens under one lock. */
static void windows_free(ect_xport *x, xp_region *ws) {
    for (xp_region *w = ws; w; w = w->next_dead) region_undo(x, w);
    pthread_mutex_lock(&x->regs.mu);
    while (ws) {
        xp_region *w = ws;
        ws = w->next_dead;
        ect_spares_put(&x->regs.spare_wins, w);
    }
    pthread_mutex_unlock(&x->regs.mu);
}

/* A zeroed window entry: a closed window's, else a new one (NULL out of
 * memory). regs.mu held. */
static xp_region *window_entry(xp_regions *t) {
    xp_region *w = ect_spares_get(&t->spare_wins);
    if (w) {
        memset(w, 0, sizeof *w);
        return w;
    }
    if ((w = calloc(1, sizeof *w))) t->windows_allocated++;
    return w;
}

int ect_xport_unregister(ect_xport *x, const char *key) {
    if (!x || !key) return ect_set_error(ECT_EINVAL, "x and key must not be NULL");
    pthread_mutex_lock(&x->regs.mu);
    xp_region *r, *tmp, *hit = NULL;
    HASH_ITER(hh, x->regs.by_token, r, tmp) {
        if (strcmp(r->keystr, key) == 0) hit = r;
    }
    if (!hit) {
        pthread_mutex_unlock(&x->regs.mu);
        return ect_set_error(ECT_ENOTFOUND, "no registered region has key '%.40s'", key);
    }
    if (hit->parent) { /* a window: ect_xport_unregister closes it, without waiting */
        pthread_mutex_unlock(&x->regs.mu);
        return xp_window_close(x, key);
    }
    region_unlink(&x->regs, hit);
    /* Its windows go with it (each waited for like the region). */
    xp_region *wins = NULL;
    HASH_ITER(hh, x->regs.by_token, r, tmp) {
        if (r->parent == hit) {
            region_unlink(&x->regs, r);
            r->next_dead = wins;
            wins = r;
        }
    }
    for (r = wins; r; r = r->next_dead)
        while (r->refs > 0) pthread_cond_wait(&x->regs.cv, &x->regs.mu);
    while (hit->refs > 0) pthread_cond_wait(&x->regs.cv, &x->regs.mu);
    /* Closed windows still being written borrow the region's fd: wait for
     * their last write too (their release frees them). */
    for (;;) {
        bool any = false;
        for (r = x->regs.dead; r && !any; r = r->next_dead) any = r->parent == hit;
        if (!any) break;
        pthread_cond_wait(&x->regs.cv, &x->regs.mu);
    }
    pthread_mutex_unlock(&x->regs.mu);
    while (wins) {
        r = wins;
        wins = r->next_dead;
        region_free(x, r);
    }
    region_free(x, hit);
    return 0;
}

/* Counts a refused write and logs the count at most once a second. Called
 * with t->mu held. */
static void refused_note(xp_regions *t, int rc) {
    t->refused++;
    uint64_t now = ect_now_ms();
    if (now - t->refused_log_ms >= 1000) {
        ECT_LOGW("xport",
                 "data plane refused %" PRIu64 " write(s) since the last such line (%" PRIu64
                 " since open); latest: %s: %s",
                 t->refused - t->refused_logged, t->refused, ect_strerror(rc), ect_last_error());
        t->refused_logged = t->refused;
        t->refused_log_ms = now;
    }
}

uint64_t xp_windows_allocated(ect_xport *x) {
    pthread_mutex_lock(&x->regs.mu);
    uint64_t n = x->regs.windows_allocated;
    pthread_mutex_unlock(&x->regs.mu);
    return n;
}

uint64_t xp_refused(ect_xport *x) {
    pthread_mutex_lock(&x->regs.mu);
    uint64_t n = x->regs.refused;
    pthread_mutex_unlock(&x->regs.mu);
    return n;
}

/* The region or window whose key string is key: by token for tcp/shm keys
 * (16 hex digits); otherwise (ucx, whose reg replaced the token string with
 * the packed rkey) by comparing key strings. t->mu held. */
static xp_region *find_key(xp_regions *t, const char *key) {
    uint64_t tok;
    xp_region *r, *tmp;
    if (xp_key_parse(key, &tok) == 0) {
        HASH_FIND(hh, t->by_token, &tok, sizeof tok, r);
        return r;
    }
    HASH_ITER(hh, t->by_token, r, tmp) {
        if (r->keystr && strcmp(r->keystr, key) == 0) return r;
    }
    return NULL;
}

int xp_region_set_private(ect_xport *x, const char *region_key) {
    if (!x || !region_key) return ect_set_error(ECT_EINVAL, "x and region_key must not be NULL");
    pthread_mutex_lock(&x->regs.mu);
    xp_region *r = find_key(&x->regs, region_key);
    if (r && !r->parent) r->priv = true;
    pthread_mutex_unlock(&x->regs.mu);
    if (!r || r->parent)
        return ect_set_error(ECT_ENOTFOUND, "no registered region has key '%.40s'", region_key);
    return 0;
}

static uint64_t addr_of(const xp_region *r) { return (uint64_t)(uintptr_t)r->addr; }

/* The index in p's window index of the first window at or after address a.
 * regs.mu held. */
static size_t wins_lower(const xp_region *p, uint64_t a) {
    size_t lo = 0, hi = p->nwins;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->wins[mid].addr < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Files window w (parent, addr and len set) in its region's index, which
 * claims its range: 0, ECT_EEXIST when it overlaps an open window, or
 * ECT_ENOMEM (errors not set). Open windows never overlap, so sorted by
 * address they are sorted by end too: only the two neighbours of w's place
 * can overlap it. regs.mu held. */
static int wins_insert(xp_region *w) {
    xp_region *p = w->parent;
    uint64_t a = addr_of(w), end = a + w->len;
    size_t i = wins_lower(p, a);
    if ((i < p->nwins && p->wins[i].addr < end) || (i > 0 && p->wins[i - 1].end > a))
        return ECT_EEXIST;
    if (p->nwins == p->capwins) {
        size_t cap = p->capwins ? 2 * p->capwins : 16;
        struct xp_win_ref *nw = realloc(p->wins, cap * sizeof *nw);
        if (!nw) return ECT_ENOMEM;
        p->wins = nw;
        p->capwins = cap;
    }
    memmove(&p->wins[i + 1], &p->wins[i], (p->nwins - i) * sizeof *p->wins);
    p->wins[i] = (struct xp_win_ref){.addr = a, .end = end, .w = w};
    p->nwins++;
    return 0;
}

/* Takes window w out of its region's index. regs.mu held. */
static void wins_remove(xp_region *w) {
    xp_region *p = w->parent;
    size_t i = wins_lower(p, addr_of(w));
    if (i >= p->nwins || p->wins[i].w != w) return; /* not filed (never: open windows are) */
    memmove(&p->wins[i], &p->wins[i + 1], (p->nwins - i - 1) * sizeof *p->wins);
    p->nwins--;
}

int xp_window_open(ect_xport *x, const char *region_key, uint64_t offset, uint64_t len,
                   char key[ECT_XPORT_KEY_MAX]) {
    if (!x || !region_key || !key)
        return ect_set_error(ECT_EINVAL, "x, region_key and key must not be NULL");
    key[0] = '\0';
    if (len == 0) return ect_set_error(ECT_EINVAL, "window len must be at least 1");
    pthread_mutex_lock(&x->regs.mu);
    xp_region *w = window_entry(&x->regs);
    if (!w) {
        pthread_mutex_unlock(&x->regs.mu);
        return ect_set_error(ECT_ENOMEM, "window");
    }
    w->fd = -1;
    xp_region *p = find_key(&x->regs, region_key), *found;
    int rc = 0;
    uint64_t end;
    if (!p || p->parent)
        rc = ect_set_error(ECT_ENOTFOUND, "no registered region has key '%.40s'", region_key);
    else if (!ect_add_u64(offset, len, &end) || end > p->len)
        rc = ect_set_error(ECT_ERANGE,
                           "window [%" PRIu64 ", +%" PRIu64 ") is outside the region (%" PRIu64
                           " bytes)",
                           offset, len, p->len);
    if (!rc) {
        w->parent = p;
        w->addr = p->addr + offset;
        w->len = len;
        w->kind = p->kind;
        w->device = p->device;
        w->fd_off = p->fd_off + offset;
        w->fd = p->fd;       /* borrowed: the region outlives its windows (unregister waits) */
        rc = wins_insert(w); /* claims the range now: a racing open of it is refused */
        if (rc == ECT_EEXIST)
            rc = ect_set_error(
                ECT_EEXIST, "window [%" PRIu64 ", +%" PRIu64 ") overlaps an open one", offset, len);
        else if (rc)
            rc = ect_set_error(ECT_ENOMEM, "window index");
    }
    if (!rc) {
        do {
            w->token = ect_random_u64();
            HASH_FIND(hh, x->regs.by_token, &w->token, sizeof w->token, found);
        } while (found || w->token == 0);
        w->id = x->regs.next_id++;
    }
    pthread_mutex_unlock(&x->regs.mu);
    w->keystr = w->keybuf;
    if (!rc) hex16(w->keystr, w->token);
    if (!rc && x->be->reg && (rc = x->be->reg(x, w)) != 0) {
        pthread_mutex_lock(&x->regs.mu);
        wins_remove(w);
        pthread_mutex_unlock(&x->regs.mu);
    }
    if (rc) {
        region_key_free(w);
        pthread_mutex_lock(&x->regs.mu);
        ect_spares_put(&x->regs.spare_wins, w);
        pthread_mutex_unlock(&x->regs.mu);
        return rc;
    }
    pthread_mutex_lock(&x->regs.mu);
    HASH_ADD(hh, x->regs.by_token, token, sizeof w->token, w);
    pthread_mutex_unlock(&x->regs.mu);
    ect_strcpy_cut(key, ECT_XPORT_KEY_MAX, w->keystr);
    return 0;
}

/* Takes the open window with key out of the table (NULL: no open window
 * has it). *now: nothing writes it, free it (outside the lock); else it is
 * dead and its last release frees it. regs.mu held. */
static xp_region *window_take(ect_xport *x, const char *key, bool *now) {
    xp_region *w = find_key(&x->regs, key);
    if (!w || !w->parent) return NULL;
    region_unlink(&x->regs, w);
    wins_remove(w);
    *now = w->refs == 0;
    if (!*now) {
        w->dead = true;
        w->next_dead = x->regs.dead;
        x->regs.dead = w;
    }
    return w;
}

int xp_window_close(ect_xport *x, const char *key) {
    if (!x || !key) return ect_set_error(ECT_EINVAL, "x and key must not be NULL");
    bool now = false;
    pthread_mutex_lock(&x->regs.mu);
    xp_region *w = window_take(x, key, &now);
    pthread_mutex_unlock(&x->regs.mu);
    if (!w) return ect_set_error(ECT_ENOTFOUND, "no open window has key '%.40s'", key);
    if (now) {
        w->next_dead = NULL;
        windows_free(x, w);
    }
    return 0;
}

size_t xp_window_close_many(ect_xport *x, const char *const *keys, size_t n) {
    if (!x || !keys) return n;
    size_t missing = 0;
    xp_region *to_free = NULL;
    pthread_mutex_lock(&x->regs.mu);
    for (size_t i = 0; i < n; i++) {
        bool now = false;
        xp_region *w = keys[i] ? window_take(x, keys[i], &now) : NULL;
        if (!w) {
            missing++;
        } else if (now) {
            w->next_dead = to_free; /* a live window's link: unused until it dies */
            to_free = w;
        }
    }
    pthread_mutex_unlock(&x->regs.mu);
    if (to_free) windows_free(x, to_free);
    if (missing) ect_set_error(ECT_ENOTFOUND, "%zu of %zu keys named no open window", missing, n);
    return missing;
}

int xp_region_acquire(xp_regions *t, uint64_t token, uint64_t addr, uint64_t len, xp_region **out) {
    uint64_t end;
    int rc = 0;
    xp_region *r;
    pthread_mutex_lock(&t->mu);
    HASH_FIND(hh, t->by_token, &token, sizeof token, r);
    if (!ect_add_u64(addr, len, &end)) {
        rc = ect_set_error(ECT_ERANGE, "write 0x%" PRIx64 " + %" PRIu64 " overflows", addr, len);
    } else if (r) {
        uint64_t base = (uint64_t)(uintptr_t)r->addr;
        xp_region *o, *tmp;
        if (addr < base || end > base + r->len) {
            /* An address inside some other region is a key mismatch. */
            HASH_ITER(hh, t->by_token, o, tmp) {
                uint64_t b = (uint64_t)(uintptr_t)o->addr;
                if (o != r && addr >= b && addr < b + o->len) rc = ECT_EACCES;
            }
        }
        if (rc)
            rc = ect_set_error(ECT_EACCES, "wrong key for the region at 0x%" PRIx64, addr);
        else if (r->priv)
            rc = ect_set_error(ECT_EACCES,
                               "region at 0x%" PRIx64 " accepts writes only with a reservation's "
                               "key",
                               addr);
        else if (addr < base || end > base + r->len)
            rc = ect_set_error(ECT_ERANGE,
                               "write [0x%" PRIx64 ", +%" PRIu64 ") is outside region [0x%" PRIx64
                               ", +%" PRIu64 ")",
                               addr, len, base, r->len);
        else
            r->refs++;
    } else {
        xp_region *o, *tmp;
        HASH_ITER(hh, t->by_token, o, tmp) {
            uint64_t b = (uint64_t)(uintptr_t)o->addr;
            if (addr >= b && addr < b + o->len) {
                rc = ect_set_error(ECT_EACCES, "wrong key for the region at 0x%" PRIx64, addr);
                break;
            }
        }
        if (!rc)
            rc = ect_set_error(ECT_ENOTFOUND, "no registered region with that key at 0x%" PRIx64,
                               addr);
    }
    if (rc) refused_note(t, rc);
    pthread_mutex_unlock(&t->mu);
    *out = rc ? NULL : r;
    return rc;
}

void xp_region_release(xp_regions *t, xp_region *r) {
    bool free_it = false;
    pthread_mutex_lock(&t->mu);
    if (--r->refs == 0) {
        pthread_cond_broadcast(&t->cv);
        if (r->dead && t->owner) {
            xp_region **pp = &t->dead;
            while (*pp && *pp != r) pp = &(*pp)->next_dead;
            if (*pp) *pp = r->next_dead;
            free_it = true;
        }
    }
    pthread_mutex_unlock(&t->mu);
    if (free_it) { /* a dead window */
        r->next_dead = NULL;
        windows_free(t->owner, r);
    }
}

bool xp_range_busy(ect_xport *x, const void *addr, uint64_t len) {
    bool busy = false;
    uint64_t a = (uint64_t)(uintptr_t)addr;
    xp_region *r, *tmp;
    pthread_mutex_lock(&x->regs.mu);
    HASH_ITER(hh, x->regs.by_token, r, tmp) {
        uint64_t b = (uint64_t)(uintptr_t)r->addr;
        if (r->refs > 0 && b < a + len && a < b + r->len) busy = true;
    }
    for (r = x->regs.dead; r && !busy; r = r->next_dead) {
        uint64_t b = (uint64_t)(uintptr_t)r->addr;
        if (b < a + len && a < b + r->len) busy = true;
    }
    pthread_mutex_unlock(&x->regs.mu);
    return busy;
}

bool xp_region_busy(ect_xport *x, const void *addr) {
    bool busy = false;
    xp_region *r, *tmp;
    pthread_mutex_lock(&x->regs.mu);
    HASH_ITER(hh, x->regs.by_token, r, tmp) {
        if (r->addr == (const uint8_t *)addr && r->refs > 0) busy = true;
    }
    pthread_mutex_unlock(&x->regs.mu);
    return busy;
}

static int session_matches(const xp_backend *be, const char *s) {
    if (be->session_prefix[0])
        return strncmp(s, be->session_prefix, strlen(be->session_prefix)) == 0;
    return strncmp(s, "shm:", 4) != 0 && strncmp(s, "ucx:", 4) != 0;
}

/* For a back end that sends from host memory only: when some writes have a
 * CUDA device source, copies those sources (one device-to-host copy each)
 * into one pinned staging buffer and returns a copy of the batch pointing
 * there (*out; NULL when no source is on a device). Caller frees *out and
 * gives *buf back with mem_stage_put. */
static int stage_device_srcs(const ect_write *w, size_t n, ect_write **out, void **buf,
                             uint64_t *cap) {
    *out = NULL;
    *buf = NULL;
    *cap = 0;
    uint64_t total = 0;
    bool any = false;
    bool *dev = NULL;
    if (!cuda_active()) return 0; /* no driver: no device source (one walk a batch) */
    for (size_t i = 0; i < n; i++) {
        if (!w[i].len || !mem_is_device(w[i].src, NULL)) continue;
        if (!dev && !(dev = calloc(n, sizeof *dev))) return ect_set_error(ECT_ENOMEM, "staging");
        dev[i] = any = true;
        total += w[i].len;
    }
    if (!any) return 0;
    ect_write *c = malloc(n * sizeof *c);
    int rc = c ? mem_stage_get(total, buf, cap) : ect_set_error(ECT_ENOMEM, "staging");
    uint64_t off = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        c[i] = w[i];
        if (!dev[i]) continue;
        c[i].src = (uint8_t *)*buf + off;
        rc = ect_mem_copy((uint8_t *)*buf + off, w[i].src, w[i].len);
        off += w[i].len;
    }
    free(dev);
    if (rc) {
        free(c);
        mem_stage_put(*buf, *cap);
        *buf = NULL;
        return ect_set_error(rc, "staging a device source: %s", ect_last_error());
    }
    *out = c;
    return 0;
}

int ect_xport_write_batch(ect_xport *x, const char *peer_session, const ect_write *w, size_t n,
                          int *statuses) {
    int rc = 0;
    if (!x || !peer_session)
        rc = ect_set_error(ECT_EINVAL, "x and peer_session must not be NULL");
    else if (!session_matches(x->be, peer_session))
        rc = ect_set_error(ECT_EINVAL, "peer_session '%.100s' is not a %s session", peer_session,
                           x->be->name);
    else if (n > 0 && !w)
        rc = ect_set_error(ECT_EINVAL, "writes must not be NULL when n > 0");
    for (size_t i = 0; !rc && i < n; i++) {
        if (!w[i].dst_key)
            rc = ect_set_error(ECT_EINVAL, "writes[%zu].dst_key is NULL", i);
        else if (!w[i].src && w[i].len > 0)
            rc = ect_set_error(ECT_EINVAL, "writes[%zu].src is NULL", i);
    }
    if (rc) {
        for (size_t i = 0; statuses && i < n; i++) statuses[i] = rc;
        return rc;
    }
    if (n == 0) return 0;
    int *st = statuses;
    if (!st && !(st = calloc(n, sizeof *st))) return ect_set_error(ECT_ENOMEM, "statuses");
    for (size_t i = 0; i < n; i++) st[i] = 0;
    ect_write *staged = NULL;
    void *sbuf = NULL;
    uint64_t scap = 0;
    if (!x->be->device_sources) {
        rc = stage_device_srcs(w, n, &staged, &sbuf, &scap);
        if (rc) {
            for (size_t i = 0; i < n; i++) st[i] = rc;
            if (st != statuses) free(st);
            return rc;
        }
        if (staged) w = staged;
    }
    rc = x->be->write_batch(x, peer_session, w, n, st);
    free(staged);
    mem_stage_put(sbuf, scap);
    if (!rc) {
        size_t i = 0;
        for (; i < n && !rc; i++) rc = st[i];
        if (rc == ECT_EINVAL)
            ect_set_error(rc, "writes[%zu].dst_key is not a key of a %s region", i - 1,
                          x->be->name);
        else if (rc)
            ect_set_error(rc, "writes[%zu] to %.100s failed: %s", i - 1, peer_session,
                          ect_strerror(rc));
    }
    if (st != statuses) free(st);
    return rc;
}

size_t xp_write_ready(ect_xport *x, const char *session, const ect_write *w, size_t n, int *st) {
    for (size_t i = 0; i < n; i++) st[i] = 1;
    if (!x || !session || !w || !n || !x->be->write_ready || !session_matches(x->be, session))
        return 0;
    for (size_t i = 0; i < n; i++) /* what write_batch would refuse: left to it */
        if (!w[i].dst_key || (!w[i].src && w[i].len > 0)) return 0;
    (void)x->be->write_ready(x, session, w, n, st); /* st says what became of each */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += st[i] <= 0;
    return k;
}

void ect_xport_close(ect_xport *x) {
    if (!x) return;
    x->be->close(x);
    xp_region *r, *tmp;
    HASH_ITER(hh, x->regs.by_token, r, tmp) {
        HASH_DEL(x->regs.by_token, r);
        region_free(x, r);
    }
    while ((r = x->regs.dead)) { /* the back end is stopped: nothing references them */
        x->regs.dead = r->next_dead;
        region_free(x, r);
    }
    if (x->be->destroy) x->be->destroy(x);
    ect_spares_clear(&x->regs.spare_wins);
    pthread_mutex_destroy(&x->regs.mu);
    pthread_cond_destroy(&x->regs.cv);
    ect_keys_free(x->keys);
    free(x);
}

void xp_auth_refused_log(ect_xport *x, const char *peer, const char *why) {
    static _Atomic uint64_t last;
    atomic_fetch_add(&x->auth_refused, 1);
    xp_log_limited(&last, "%s target: refused %s: %s (%" PRIu64 " connections refused so far)",
                   x->be->name, peer, why, (uint64_t)atomic_load(&x->auth_refused));
}

uint64_t xp_auth_refused(ect_xport *x) { return atomic_load(&x->auth_refused); }

/* ---- offers (shm; docs/PROTOCOL.md "shm", "Offers") */

int xp_window_offer(ect_xport *x, uint64_t id, const char *const *keys, size_t n) {
    if (!x || !keys) return ect_set_error(ECT_EINVAL, "x and keys must not be NULL");
    if (!x->be->offer) return ect_set_error(ECT_ENOTSUP, "%s has no offers", x->be->name);
    return x->be->offer(x, id, keys, n);
}

void xp_set_offer_id(ect_xport *x, uint64_t id) { x->offer_id = id; }
