/*
 * shm_initiator — the initiator side of the shm transport: connections to
 * targets (cached per session in conncache), the regions each connection
 * mapped, and the copies (docs/PROTOCOL.md "shm").
 *
 * A host region arrives as an fd the first time a connection is granted it;
 * the connection maps the pages that cover it once and keeps the mapping
 * until the target reports the region gone. A write window is such a region
 * (one per reservation): when a GRANT drops a closed window and grants a new
 * one on the same pages (or some of them), the new window takes over the old
 * mapping, trimmed to its own pages, instead of an munmap and a fresh
 * populated mmap (map_region). A dropped mapping that no window of its
 * GRANT takes over is parked with PROT_NONE instead of unmapped (a stray
 * write through it faults as through an unmapped address), at most
 * SHM_PARK_MAPS of them and SHM_PARK_BYTES per connection (oldest released
 * first) and SHM_PARK_PROCESS in the process, and only while the connection
 * holds the pool's file: a later window whose pages start where a parked
 * mapping's do revives it (mprotect read-write, trimmed to the window's
 * pages) instead of a populated mmap, and its drop later is an mprotect
 * instead of an munmap (the mappings one GRANT drops, or revives, that lie
 * end to end are parked, or revived, by one mprotect per run: retired_park,
 * revive). So no writable mapping lies outside a live window.
 * An offered window that no retired mapping covers, of at most
 * SHM_DIRECT_MAX bytes in a file the connection holds, is not mapped at all
 * ("direct") when it is offered alone (an OFFER of one entry: a lone
 * step's spare or reservation), or when the connection's offered windows
 * have lately not nearly always landed on pages their own OFFER dropped
 * (the reuse score, below SHM_REUSE_MAP: several steps in flight, whose
 * dropped ranges are still held by items the consumer has not taken); a
 * larger one where a page-table change costs many times a pwrite of the
 * same bytes (a shadow-paged guest: measured once per process,
 * shm_remaps_dear), unless it lies on pages its own message freed. Its
 * copies are pwrite(2) calls into the file at the window's offset, checked
 * against the window and its slot like any fast-path copy. It costs no
 * mapping, revival or park: page-table changes that no later window would
 * reuse (an mprotect pair, a TLB shootdown and, on a guest whose page
 * tables its hypervisor shadows, a fault per page on the next copy), and
 * leaves nothing mapped when it closes. While windows keep landing on
 * freed pages (one step in flight), they are mapped and taken over.
 * A file drop and the connection's close unmap the file's parked mappings.
 *
 * A CUDA device region arrives as its IPC handle instead, which the
 * connection opens once (mem/cuda.c counts opens of one
 * handle); its copies go through the driver: device-to-device from a device
 * source, host-to-device from a host one, waited for before the write counts
 * as landed. A target in the initiator's own process (the handle carries a
 * per-process token) is written through its device address directly, since
 * the driver refuses to open a handle in the process that exported it.
 *
 * A write window's pool file comes once per connection (SHM_HELLO_FILES):
 * with the first window of a pool its fd arrives numbered and is kept in
 * the connection's file table; later windows of that pool name the number
 * and carry no fd (no fd passing, fstat or close per window); the target's
 * file drop, once the pool is gone, closes it.
 *
 * A write into a region this connection mapped takes the fast path: no
 * message, only the control segment's `users` count and `state` check;
 * everything else goes through BEGIN / GRANT / copy / DONE, one round trip
 * per chunk of up to SHM_CHUNK writes.
 *
 * Offers (x->offer_id set: HELLO bit 2, then the ID): a target may grant
 * windows unasked (OFFER), before the producer even has their reserve
 * reply; the connection applies them as a GRANT's mappings and drops, with
 * no copy and no DONE, wherever it reads the socket (waiting for a GRANT:
 * recv_past_offers; leaving the cache, the first message; a write that
 * missed its window and after a fast batch, all: drain_offers), so the
 * write into an offered window takes the fast path.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <utlist.h>

#include "mem/cuda.h"
#include "mem/memkind.h"
#include "util/bigcopy.h"
#include "util/util.h"
#include "xport/auth.h"
#include "xport/shm.h"

/* Where a host mapping lies: its memory file and its page-aligned offset
 * in it (a parked mapping's key; three u64, no padding). */
typedef struct shm_at {
    uint64_t fdev, ino, aoff;
} shm_at;

typedef struct shm_map {
    uint64_t rid;   /* target's region id */
    uint64_t token; /* its key */
    uint32_t slot;  /* its slot in the control segment */
    uint8_t *base;  /* its mapping (page-aligned before it); NULL: CUDA, or direct */
    size_t maplen;
    int kind;       /* ECT_MEM_CUDA: start is a device address (copies through the driver) */
    int dev;        /* device the copies run on */
    void *ipc_base; /* the opened IPC allocation (cuda_ipc_close), or NULL */
    uint8_t *start; /* the region's first byte */
    uint64_t raddr, rlen;
    shm_at at;                   /* host: where the mapping lies in its file */
    bool direct;                 /* host, not mapped: copies are pwrite(fd, foff + ...) */
    int fd;                      /* direct: the held file's fd (file_close drops the window) */
    uint64_t foff;               /* direct: the region's offset in the file */
    struct shm_map *next, *prev; /* in a chunk's list of retired mappings, or the parked list */
    UT_hash_handle hh;           /* by rid */
    UT_hash_handle hh_tok;       /* by token */
    UT_hash_handle hh_park;      /* parked: by at */
} shm_map;

/* A memory file (a region's fd) and what fstat said of it. */
typedef struct shm_file {
    uint32_t num; /* the target's number for it on this connection; 0: none */
    int fd;
    uint64_t dev, ino, size, blksize;
} shm_file;

typedef struct shm_conn {
    int fd;
    shm_impl *si;  /* its back end (counters) */
    bool offers;   /* the target sends OFFERs on this connection */
    uint8_t *obuf; /* an OFFER being read (SHM_OFFER_MAX), made on the first */
    shm_slot *seg; /* the target's control segment for this connection */
    shm_map *maps; /* this connection's mappings, by region id */
    shm_map *by_tok;
    shm_file *files; /* pools' memory files held by number (SHM_HELLO_FILES) */
    size_t nfiles, capfiles;
    shm_map *parked;     /* dropped windows' mappings, PROT_NONE, by at */
    shm_map *park_order; /* the same, oldest parked first */
    size_t nparked;
    uint64_t parked_bytes;
    /* How often, lately, a new small window lay on pages that a window its
     * own message dropped had covered (SHM_REUSE_ONE means always): when
     * that is rare, mapping new windows costs page-table changes (revive,
     * fresh mmap, park) that no later window reuses, so they go direct. */
    uint32_t reuse;
} shm_conn;

static shm_file *file_find(shm_conn *c, uint32_t num) {
    for (size_t i = 0; i < c->nfiles; i++)
        if (c->files[i].num == num) return &c->files[i];
    return NULL;
}

/* Keeps f (its fd included) under its number; false when out of memory. */
static bool file_keep(shm_conn *c, const shm_file *f) {
    if (c->nfiles == c->capfiles) {
        size_t nc = c->capfiles ? 2 * c->capfiles : 4;
        shm_file *nv = realloc(c->files, nc * sizeof *nv);
        if (!nv) return false;
        c->files = nv;
        c->capfiles = nc;
    }
    c->files[c->nfiles++] = *f;
    return true;
}

/* True when the connection holds memory file dev/ino under a number. */
static bool file_held(const shm_conn *c, uint64_t dev, uint64_t ino) {
    for (size_t i = 0; i < c->nfiles; i++)
        if (c->files[i].dev == dev && c->files[i].ino == ino) return true;
    return false;
}

/* Every connection's parked mappings, at most SHM_PARK_PROCESS (each is a
 * VMA: many cached connections must not run into vm.max_map_count). */
static size_t parked_in_process;

static void park_count_down(void) { __atomic_sub_fetch(&parked_in_process, 1, __ATOMIC_RELAXED); }

static bool park_count_up(void) {
    if (__atomic_add_fetch(&parked_in_process, 1, __ATOMIC_RELAXED) <= SHM_PARK_PROCESS)
        return true;
    park_count_down();
    return false;
}

static void unmap_free(shm_map *m) {
    munmap(m->base, m->maplen);
    free(m);
}

static void park_remove(shm_conn *c, shm_map *m) {
    park_count_down();
    HASH_DELETE(hh_park, c->parked, m);
    DL_DELETE(c->park_order, m);
    c->nparked--;
    c->parked_bytes -= m->maplen;
    m->next = m->prev = NULL;
}

static void park_release(shm_conn *c, shm_map *m) {
    park_remove(c, m);
    unmap_free(m);
}

/* True when a retired host mapping that nothing took over may be parked:
 * its file is held (not a window of a file the target did not number, nor
 * of a pool already gone), it fits the connection's bound, and the process
 * holds fewer than SHM_PARK_PROCESS parked mappings (counted here). */
static bool park_admit(shm_conn *c, const shm_map *m) {
    return file_held(c, m->at.fdev, m->at.ino) && m->maplen <= SHM_PARK_BYTES && park_count_up();
}

/* Keeps an admitted mapping, already PROT_NONE, for a later window on its
 * pages; the oldest parked ones are released beyond the connection's
 * bounds. */
static void park_keep(shm_conn *c, shm_map *m) {
    shm_map *old;
    HASH_FIND(hh_park, c->parked, &m->at, sizeof m->at, old);
    if (old) park_release(c, old);
    HASH_ADD(hh_park, c->parked, at, sizeof m->at, m);
    DL_APPEND(c->park_order, m);
    c->nparked++;
    c->parked_bytes += m->maplen;
    while (c->nparked > SHM_PARK_MAPS || c->parked_bytes > SHM_PARK_BYTES)
        park_release(c, c->park_order);
}

/* The parked mapping that starts at `at`, taken for a new window of ml
 * bytes there: trimmed to them, still PROT_NONE (the chunk revives it with
 * its GRANT's others: revive). NULL when none is parked there or it is
 * shorter (then it is released). */
static shm_map *park_take(shm_conn *c, const shm_at *at, size_t ml) {
    shm_map *m;
    HASH_FIND(hh_park, c->parked, at, sizeof *at, m);
    if (!m) return NULL;
    if (m->maplen < ml) {
        park_release(c, m);
        return NULL;
    }
    park_remove(c, m);
    if (m->maplen > ml) munmap(m->base + ml, m->maplen - ml);
    m->maplen = ml;
    return m;
}

static void map_drop(shm_conn *c, shm_map *m) {
    HASH_DEL(c->maps, m);
    HASH_DELETE(hh_tok, c->by_tok, m);
    if (m->base) munmap(m->base, m->maplen);
    cuda_ipc_close(m->ipc_base);
    free(m);
}

/* The target dropped file `num` (its pool is gone): unmap its parked
 * mappings, close our fd. Live mappings made from it stay valid until their
 * own windows are dropped (then unmapped: the file is no longer held). */
static void file_close(shm_conn *c, uint32_t num) {
    shm_file *f = file_find(c, num);
    if (!f) return;
    shm_map *m, *tmp;
    DL_FOREACH_SAFE(c->park_order, m, tmp) {
        if (m->at.fdev == f->dev && m->at.ino == f->ino) park_release(c, m);
    }
    HASH_ITER(hh, c->maps, m, tmp) {
        if (m->direct && m->fd == f->fd) map_drop(c, m);
    }
    close(f->fd);
    *f = c->files[--c->nfiles];
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
    if (e->proc_token == shm_process_token()) {
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
 * memcpy between host memory (a large one on two threads, util/bigcopy),
 * else one driver copy, waited for. */
static int put_bytes(const shm_map *m, uint8_t *dst, const void *src, uint64_t len, int skind,
                     int sdev) {
    if (!len) return 0;
    if (m->kind != ECT_MEM_CUDA && skind != ECT_MEM_CUDA) {
        ect_bigcopy(dst, src, (size_t)len);
        return 0;
    }
    return cuda_copy(dst, src, len, m->kind == ECT_MEM_CUDA ? m->dev : sdev);
}

/* A direct window's copy of len bytes from src to its byte off: pwrite(2)
 * into the file; a device source through a mapping of just those pages,
 * made for the copy and unmapped after it (the window is live meanwhile). */
static int direct_put(const shm_map *m, uint64_t off, const void *src, uint64_t len, int skind,
                      int sdev) {
    uint64_t pos = m->foff + off;
    if (skind == ECT_MEM_CUDA) {
        uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), a = pos & ~(pg - 1);
        size_t ml = (size_t)((pos + len - a + pg - 1) & ~(pg - 1));
        void *b = mmap(NULL, ml, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, (off_t)a);
        if (b == MAP_FAILED) return ect_set_errno(errno, "shm: mmap of region %" PRIu64, m->rid);
        int rc = cuda_copy((uint8_t *)b + (pos - a), src, len, sdev);
        munmap(b, ml);
        return rc;
    }
    const uint8_t *p = src;
    while (len) {
        ssize_t k = pwrite(m->fd, p, (size_t)len, (off_t)pos);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return k < 0 ? ect_set_errno(errno, "shm: write into region %" PRIu64, m->rid)
                         : ect_set_error(ECT_EIO, "shm: region %" PRIu64 " ends early", m->rid);
        p += k;
        pos += (uint64_t)k;
        len -= (uint64_t)k;
    }
    return 0;
}

/* Puts len bytes from src at byte off of the region mapping m covers. */
static int put_window(const shm_map *m, uint64_t off, const void *src, uint64_t len, int skind,
                      int sdev) {
    if (m->direct) return direct_put(m, off, src, len, skind, sdev);
    return put_bytes(m, m->start + off, src, len, skind, sdev);
}

static void conn_free(shm_conn *c) {
    shm_map *m, *tmp;
    HASH_ITER(hh, c->maps, m, tmp) map_drop(c, m);
    while (c->park_order) park_release(c, c->park_order);
    if (c->seg) munmap(c->seg, SHM_SEG_LEN);
    if (c->fd >= 0) close(c->fd);
    for (size_t i = 0; i < c->nfiles; i++) close(c->files[i].fd);
    free(c->files);
    free(c->obuf);
    free(c);
}

/* A peer's address: the abstract socket its session "shm:@NAME" names. */
typedef struct shm_addr {
    struct sockaddr_un sa;
    socklen_t salen;
} shm_addr;

static int parse_session(const char *session, void **addr) {
    if (strncmp(session, "shm:@", 5) != 0)
        return ect_set_error(ECT_EINVAL, "peer_session '%.100s' is not shm:@NAME", session);
    shm_addr *a = malloc(sizeof *a);
    if (!a) return ect_set_error(ECT_ENOMEM, "peer");
    int rc = shm_make_addr(session + 5, &a->sa, &a->salen);
    if (rc) {
        free(a);
        return rc;
    }
    *addr = a;
    return 0;
}

static void close_conn(xp_conn c) { conn_free(c.ctx); }

static bool conn_alive(xp_conn x);

const xp_conn_ops shm_conn_ops = {parse_session, close_conn, conn_alive};

/* A cached connection, or a new one: connect, HELLO, map the control
 * segment the reply carries. */
static int take_conn(ect_xport *x, xp_peer *p, shm_conn **out) {
    shm_impl *s = x->impl;
    xp_conn cached;
    if (xp_cache_take(&s->cache, p, &cached)) {
        *out = cached.ctx;
        return 0;
    }
    const shm_addr *a = p->addr;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return ect_set_errno(errno, "shm: socket");
    if (connect(fd, (const struct sockaddr *)&a->sa, a->salen) != 0) {
        int rc =
            ect_set_error(ECT_ECONNREFUSED, "shm: connect to %s: %s", p->session, strerror(errno));
        close(fd);
        return rc;
    }
    if (!shm_same_uid(fd)) {
        close(fd);
        return ect_set_error(ECT_EACCES, "shm: %s belongs to another user", p->session);
    }
    uint8_t h[XP_AUTH_LEN];
    size_t len;
    int segfd = -1, nf = 0;
    void *seg = MAP_FAILED;
    struct stat st;
    xp_auth_frame af;
    shm_hello_encode(h);
    xp_put_u16(h + 6, (uint16_t)(SHM_HELLO_FILES | (x->keys ? SHM_HELLO_AUTH : 0) |
                                 (x->offer_id ? SHM_HELLO_OFFERS : 0)));
    int rc = shm_msg_send(fd, h, SHM_HELLO_LEN, NULL, 0, x->opts.io_timeout_ms);
    shm_set_timeouts(fd, x->opts.io_timeout_ms);
    if (!rc && x->keys) {
        shm_auth_io io = {fd, x->opts.io_timeout_ms};
        xp_auth_io aio = {shm_auth_send, shm_auth_recv, &io};
        rc = xp_auth_initiator(x->keys, &aio, p->session);
        if (rc) {
            close(fd);
            return rc;
        }
    }
    if (!rc) rc = shm_msg_recv(fd, h, sizeof h, &len, &segfd, 1, &nf, false, x->opts.io_timeout_ms);
    if (rc == ECT_ECLOSED)
        rc = ect_set_error(ECT_ECONNREFUSED, "shm: %s refused the hello", p->session);
    /* A keyed target refuses a plain HELLO with a RESULT frame saying so. */
    if (!rc && len == XP_AUTH_LEN && xp_auth_decode(h, len, &af) == 0 &&
        af.type == XP_AUTH_RESULT && af.verdict != XP_AUTH_OK)
        rc = ect_set_error(ECT_EACCES, "shm: the target %s refused us: %s", p->session,
                           af.verdict == XP_AUTH_KEYS_REQUIRED
                               ? "it requires data-plane keys; set curve_keys to a key "
                                 "directory it accepts"
                               : xp_auth_verdict_str(af.verdict));
    if (!rc && (shm_hello_reply_decode(h, len) != 0 || nf != 1 || fstat(segfd, &st) != 0 ||
                (uint64_t)st.st_size < SHM_SEG_LEN))
        rc = ect_set_error(ECT_EPROTO, "shm: bad hello from %s", p->session);
    if (!rc) {
        seg = mmap(NULL, SHM_SEG_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, segfd, 0);
        if (seg == MAP_FAILED) rc = ect_set_errno(errno, "shm: map of the control segment");
    }
    if (nf == 1) close(segfd);
    /* A target that sends offers said so in its reply (an older one ignores
     * the flag and replies 0): name ourselves, before any BEGIN. */
    bool offers = !rc && x->offer_id && (shm_hello_flags(h) & SHM_HELLO_OFFERS);
    if (offers) {
        shm_id_encode(h, x->offer_id);
        rc = shm_msg_send(fd, h, SHM_ID_LEN, NULL, 0, x->opts.io_timeout_ms);
    }
    shm_conn *c = rc ? NULL : calloc(1, sizeof *c);
    if (!c) {
        if (seg != MAP_FAILED) munmap(seg, SHM_SEG_LEN);
        close(fd);
        return rc ? rc : ect_set_error(ECT_ENOMEM, "shm connection");
    }
    c->fd = fd;
    c->seg = seg;
    c->si = s;
    c->offers = offers;
    c->reuse = SHM_REUSE_ONE;
    *out = c;
    return 0;
}

static int by_base(const shm_map *a, const shm_map *b) {
    return a->base < b->base ? -1 : a->base > b->base;
}

/* Cuts the run of mappings from `run` on (a list sorted by base) that lie
 * end to end in the address space off the list; returns the first mapping
 * after it, *len the run's bytes. */
static shm_map *run_cut(shm_map *run, size_t *len) {
    shm_map *last = run;
    while (last->next && last->base + last->maplen == last->next->base) last = last->next;
    shm_map *rest = last->next;
    last->next = NULL;
    *len = (size_t)(last->base + last->maplen - run->base);
    return rest;
}

/* What one GRANT does to the connection's host mappings: the mappings its
 * drop list retired (still read-write; parked or unmapped at the chunk's
 * end unless a new window takes one over) and the parked ones its windows
 * took (made read-write before the copies). */
typedef struct grant_maps {
    shm_map *retired, *reviving;
    bool offer;      /* an OFFER: its windows count in the reuse score */
    bool lone_offer; /* an OFFER of one window: it may be direct (map_region) */
    /* Where the direct windows its drop list closed lay (the first
     * SHM_GONE_MAX): with the retired mappings, what a new window's pages
     * are checked against for the connection's reuse score. */
    shm_at gone[SHM_GONE_MAX];
    size_t gone_len[SHM_GONE_MAX];
    uint32_t ngone;
} grant_maps;

/* Parks (or unmaps) what a chunk retired and did not reuse. Mappings that
 * lie end to end in the address space (the kernel places a step's fresh
 * mappings side by side, and a revived one keeps its address) are made
 * PROT_NONE by one mprotect per run: one TLB flush (and its IPIs) per run
 * instead of one per window. */
static void retired_park(shm_conn *c, shm_map *r) {
    shm_map *keep = NULL;
    while (r) {
        shm_map *nx = r->next;
        r->next = NULL;
        if (park_admit(c, r))
            LL_PREPEND(keep, r);
        else
            unmap_free(r);
        r = nx;
    }
    LL_SORT(keep, by_base);
    while (keep) {
        size_t len;
        shm_map *rest = run_cut(keep, &len);
        bool ok = mprotect(keep->base, len, PROT_NONE) == 0;
        while (keep) {
            shm_map *nx = keep->next;
            keep->next = NULL;
            if (ok) {
                park_keep(c, keep);
            } else {
                park_count_down();
                unmap_free(keep);
            }
            keep = nx;
        }
        keep = rest;
    }
}

/* Makes the parked mappings this GRANT's windows took (park_take, already
 * in the tables) read-write, one mprotect per run that lies end to end:
 * mprotect's per-call cost once per run instead of once per window. A run
 * whose mprotect fails leaves the tables, unmapped (its writes are refused
 * as not mapped here). */
static void revive(shm_conn *c, shm_map *rv) {
    LL_SORT(rv, by_base);
    while (rv) {
        size_t len;
        shm_map *rest = run_cut(rv, &len);
        bool ok = mprotect(rv->base, len, PROT_READ | PROT_WRITE) == 0;
        while (rv) {
            shm_map *nx = rv->next;
            rv->next = NULL;
            if (!ok) map_drop(c, rv);
            rv = nx;
        }
        rv = rest;
    }
}

/* True when the len bytes of a file from `in`->aoff on hold the ml bytes
 * of the same file from at->aoff on. */
static bool at_covers(const shm_at *in, size_t len, const shm_at *at, size_t ml) {
    return in->fdev == at->fdev && in->ino == at->ino && in->aoff <= at->aoff &&
           at->aoff + ml <= in->aoff + len;
}

/* A mapping retired by this GRANT's drop list (still read-write) that
 * covers ml bytes of the file from at->aoff on, taken over: its pages
 * beyond them unmapped. NULL when none covers them. */
static shm_map *retired_take(shm_map **retired, const shm_at *at, size_t ml) {
    shm_map **pp = retired;
    while (*pp && !at_covers(&(*pp)->at, (*pp)->maplen, at, ml)) pp = &(*pp)->next;
    shm_map *m = *pp;
    if (!m) return NULL;
    *pp = m->next;
    m->next = NULL;
    size_t head = (size_t)(at->aoff - m->at.aoff), tail = m->maplen - head - ml;
    if (head) munmap(m->base, head);
    if (tail) munmap(m->base + head + ml, tail);
    m->base += head;
    m->maplen = ml;
    m->at.aoff = at->aoff;
    return m;
}

/* A fresh populated read-write mapping of ml bytes of f at at->aoff. */
static int map_fresh(const shm_file *f, const shm_at *at, size_t ml, uint64_t rid, shm_map **out) {
    /* Populated at once: one kernel pass instead of a fault per page during
     * the copy (each new window is a fresh mapping). */
    void *b =
        mmap(NULL, ml, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, f->fd, (off_t)at->aoff);
    if (b == MAP_FAILED) return ect_set_errno(errno, "shm: mmap of region %" PRIu64, rid);
    shm_map *m = calloc(1, sizeof *m);
    if (!m) {
        munmap(b, ml);
        return ect_set_error(ECT_ENOMEM, "shm mapping");
    }
    m->base = b;
    m->maplen = ml;
    m->at = *at;
    *out = m;
    return 0;
}

/* True when a window of file f could be direct (not mapped, written by
 * pwrite): in a file the connection holds (held: f is in its table, so the
 * fd outlives the window), and a file of ordinary pages (a huge-page file
 * takes no write(2)). */
static bool direct_fits(const shm_file *f, bool held) {
    return held && f->blksize <= (uint64_t)sysconf(_SC_PAGESIZE);
}

/* True when the ml bytes of a file from at->aoff on lie inside a direct
 * window this message closed (gm->gone). */
static bool gone_covers(const grant_maps *gm, const shm_at *at, size_t ml) {
    for (uint32_t i = 0; i < gm->ngone; i++)
        if (at_covers(&gm->gone[i], gm->gone_len[i], at, ml)) return true;
    return false;
}

/* Counts one small window into c's reuse score: whether its pages lay
 * inside a window its own message dropped (mapped or direct), i.e. whether
 * a mapping of it would have cost no page-table change. */
static void reuse_note(shm_conn *c, bool reused) {
    c->reuse -= c->reuse / SHM_REUSE_SPAN;
    if (reused) c->reuse += SHM_REUSE_ONE / SHM_REUSE_SPAN;
}

/* The page-table probe (SHM_REMAP_DEAR): the mode tests set, and what the
 * one measurement of this process found. */
static int remap_mode = SHM_REMAP_MEASURE;
static pthread_once_t remap_once = PTHREAD_ONCE_INIT;
static bool remap_dear;

/* Best of three, on a memory file of SHM_REMAP_PROBE bytes already mapped
 * and touched: an mprotect pair (a park and a revival) and a copy into
 * the pages it changed, against a pwrite of the same bytes. Anything that
 * fails leaves page-table changes taken as cheap (mapped, as before). */
static void remap_probe(void) {
    size_t n = SHM_REMAP_PROBE;
    int fd = memfd_create("ect-remap-probe", MFD_CLOEXEC);
    uint8_t *src = malloc(n), *m = MAP_FAILED;
    if (fd >= 0 && src && ftruncate(fd, (off_t)n) == 0)
        m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) {
        memset(src, 0x5a, n);
        memcpy(m, src, n);
        uint64_t remap_ns = UINT64_MAX, pwrite_ns = UINT64_MAX;
        bool ok = true;
        for (int k = 0; k < 3 && ok; k++) {
            uint64_t t0 = ect_now_ns();
            ok = mprotect(m, n, PROT_NONE) == 0 && mprotect(m, n, PROT_READ | PROT_WRITE) == 0;
            memcpy(m, src, n);
            uint64_t t1 = ect_now_ns();
            ok = ok && pwrite(fd, src, n, 0) == (ssize_t)n;
            uint64_t t2 = ect_now_ns();
            if (t1 - t0 < remap_ns) remap_ns = t1 - t0;
            if (t2 - t1 < pwrite_ns) pwrite_ns = t2 - t1;
        }
        remap_dear = ok && remap_ns > (uint64_t)SHM_REMAP_DEAR * pwrite_ns;
        ECT_LOGI("shm",
                 "page-table probe: an mprotect pair and a copy of %zu KiB %.1f us, a pwrite "
                 "%.1f us: larger windows that land on other pages are %s",
                 n >> 10, (double)remap_ns / 1e3, (double)pwrite_ns / 1e3,
                 remap_dear ? "written with pwrite (page-table changes are dear here)" : "mapped");
        munmap(m, n);
    }
    free(src);
    if (fd >= 0) close(fd);
}

void shm_remap_mode(int mode) { __atomic_store_n(&remap_mode, mode, __ATOMIC_RELAXED); }

bool shm_remaps_dear(void) {
    int mode = __atomic_load_n(&remap_mode, __ATOMIC_RELAXED);
    if (mode != SHM_REMAP_MEASURE) return mode == SHM_REMAP_IS_DEAR;
    pthread_once(&remap_once, remap_probe);
    return remap_dear;
}

/* A direct window over bytes [foff, foff + rlen) of held file f, whose
 * pages are the ml bytes from at->aoff on (kept for the reuse score). */
static int map_direct(shm_conn *c, const shm_file *f, uint64_t foff, const shm_at *at, size_t ml,
                      shm_map **out) {
    shm_map *m = calloc(1, sizeof *m);
    if (!m) return ect_set_error(ECT_ENOMEM, "shm mapping");
    m->direct = true;
    m->fd = f->fd;
    m->foff = foff;
    m->at = *at;
    m->maplen = ml;
    if (c->si) __atomic_add_fetch(&c->si->directs, 1, __ATOMIC_RELAXED);
    *out = m;
    return 0;
}

/* Maps a granted host region from memory file f: exactly the pages that
 * cover it, read-write. When a mapping retired by this same GRANT's drop
 * list covers those pages of the same file (the pool handed a closed
 * window's range, or part of it, to the new one), that mapping is taken
 * over, its pages beyond the new window unmapped; else an offered window
 * that may be direct (direct_fits) is not mapped at all when it is small
 * (SHM_DIRECT_MAX) and offered alone or on a connection whose reuse score
 * is below SHM_REUSE_MAP, or when it is larger, page-table changes are
 * dear here (shm_remaps_dear) and no window its message dropped (mapped or
 * direct) covered its pages; else a
 * parked mapping that starts on the same page is revived; only then is a
 * populated mmap made. Either way nothing read-write lies beyond the new
 * window (a retired mapping is parked or unmapped by the end of its chunk).
 * The caller keeps or closes f's fd (held: f is the connection's). */
static int map_region(shm_conn *c, const shm_grant_entry *e, const shm_file *f, bool held,
                      uint64_t token, grant_maps *gm) {
    uint64_t rid = e->rid, raddr = e->raddr, rlen = e->rlen, foff = e->fd_off;
    uint32_t slot = e->slot;
    shm_map *m;
    HASH_FIND(hh, c->maps, &rid, sizeof rid, m);
    if (m) return 0; /* already mapped: the target sent it twice; keep ours */
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), aoff, end;
    if (!ect_add_u64(foff, rlen, &end) || rlen == 0 || rlen > SIZE_MAX / 2 || f->size < end ||
        slot >= SHM_SLOTS)
        return ect_set_error(ECT_EPROTO, "shm: region %" PRIu64 " does not fit its fd", rid);
    /* Map only the pages that cover the region (a write window is a few
     * pages of a large pool file): the file's own page size, 2 MiB for a
     * huge-page pool, where mmap offsets must be multiples of it. */
    uint64_t bs = f->blksize;
    if (bs > pg && bs <= (1ull << 30) && (bs & (bs - 1)) == 0) pg = bs;
    aoff = foff & ~(pg - 1);
    size_t ml = (size_t)(rlen + (foff - aoff));
    ml = (ml + pg - 1) & ~(size_t)(pg - 1);
    shm_at at = {f->dev, f->ino, aoff};
    bool may_direct = gm->offer && direct_fits(f, held), small = rlen <= SHM_DIRECT_MAX;
    m = retired_take(&gm->retired, &at, ml);
    bool reused = m || gone_covers(gm, &at, ml); /* on pages its own message freed */
    if (may_direct && small) reuse_note(c, reused);
    if (!m) {
        int rc = 0;
        /* Small: on the score. Larger, where page-table changes are dear:
         * direct unless it lies on pages its own message freed (one step
         * in flight: mapped once, its successors take the mapping over). */
        bool direct =
            small ? gm->lone_offer || c->reuse < SHM_REUSE_MAP : !reused && shm_remaps_dear();
        if (may_direct && direct)
            rc = map_direct(c, f, foff, &at, ml, &m);
        else if ((m = park_take(c, &at, ml)) != NULL)
            LL_PREPEND(gm->reviving, m);
        else
            rc = map_fresh(f, &at, ml, rid, &m);
        if (rc) return rc;
    }
    uint8_t *b = m->base;
    m->rid = rid;
    m->kind = ECT_MEM_HOST;
    m->start = b ? b + (foff - aoff) : NULL;
    m->raddr = raddr;
    m->rlen = rlen;
    m->token = token;
    m->slot = slot;
    map_add(c, m);
    return 0;
}

/* A granted region whose fd came with the GRANT: maps it, then keeps the fd
 * when the target numbered the file (later windows of the same pool come
 * without one), else closes it. */
static int map_fd(shm_conn *c, const shm_grant_entry *e, int fd, uint64_t token, grant_maps *gm) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return ect_set_error(ECT_EPROTO, "shm: region %" PRIu64 " came with a bad fd", e->rid);
    }
    shm_file f = {e->file,
                  fd,
                  (uint64_t)st.st_dev,
                  (uint64_t)st.st_ino,
                  (uint64_t)st.st_size,
                  (uint64_t)st.st_blksize};
    int rc = map_region(c, e, &f, false, token, gm);
    if (!e->file || file_find(c, e->file) || !file_keep(c, &f)) close(fd);
    return rc;
}

/* A granted region in a memory file the connection holds (SHM_GF_FILE). */
static int map_file(shm_conn *c, const shm_grant_entry *e, uint64_t token, grant_maps *gm) {
    const shm_file *f = file_find(c, e->file);
    if (!f)
        return ect_set_error(ECT_EPROTO, "shm: region %" PRIu64 " names file %u, not held here",
                             e->rid, e->file);
    return map_region(c, e, f, true, token, gm);
}

/* A write's source: its kind (ECT_MEM_CUDA or host) and device. */
typedef struct src_kind {
    int kind, dev;
} src_kind;

/* Maps the regions of GRANT (or OFFER) g's entries, entry i under key
 * etok[i], and closes the fds it carried: es[i] is entry i's status (0:
 * mapped), rids[i] its region. Parked mappings taken are left on
 * gm->reviving, PROT_NONE. Returns true when the target named a memory
 * file not held here (we could not keep it). */
static bool grant_map(shm_conn *c, const uint8_t *buf, const shm_grant *g, const uint64_t *etok,
                      const int *fds, int nfds, grant_maps *gm, int32_t *es, uint64_t *rids) {
    uint32_t n = g->n;
    int fi = 0;
    uint32_t ipc_seen = 0;
    bool lost_file = false;
    for (uint32_t i = 0; i < n; i++) {
        shm_grant_entry e;
        shm_grant_entry_get(buf, g, i, &ipc_seen, &e);
        int32_t s = e.status;
        if (e.flags & SHM_GF_FD) {
            int err = map_fd(c, &e, fds[fi++], etok[i], gm);
            if (err && s == 0) s = err;
        } else if (e.flags & SHM_GF_FILE) {
            int err = map_file(c, &e, etok[i], gm);
            lost_file |= err == ECT_EPROTO && !file_find(c, e.file);
            if (err && s == 0) s = err;
        } else if (e.flags & SHM_GF_IPC) {
            int err = map_ipc(c, &e, etok[i]);
            if (err && s == 0) s = err;
        }
        if (s > 0 || s < ECT_EOVERFLOW) s = ECT_EPROTO;
        es[i] = s;
        rids[i] = e.rid;
    }
    while (fi < nfds) close(fds[fi++]);
    return lost_file;
}

/* Copies each write idx[i] whose entry mapped (es[i] == 0) into its region
 * rids[i], checked against the mapping; every write's status to st. */
static void grant_copy(shm_conn *c, const ect_write *w, const size_t *idx, uint32_t n,
                       const src_kind *sk, const int32_t *es, const uint64_t *rids, int *st) {
    for (uint32_t i = 0; i < n; i++) {
        size_t wi = idx[i];
        if (es[i]) {
            st[wi] = es[i];
            continue;
        }
        shm_map *m;
        HASH_FIND(hh, c->maps, &rids[i], sizeof rids[i], m);
        uint64_t a = w[wi].dst_addr, end;
        /* Never trust the grant blindly: the copy must stay inside our map. */
        if (!m || a < m->raddr || !ect_add_u64(a, w[wi].len, &end) || end > m->raddr + m->rlen) {
            st[wi] = ect_set_error(ECT_EPROTO, "shm: GRANT for a region not mapped here");
            continue;
        }
        st[wi] = put_window(m, a - m->raddr, w[wi].src, w[wi].len, sk[wi].kind, sk[wi].dev);
    }
}

/* The first half of applying a GRANT or OFFER g: its drop list retires
 * the dropped host mappings (out of the tables at once: no write can reach
 * them any more; parked or unmapped by grant_end unless a new window takes
 * one over, map_region), then its entries are mapped (grant_map) and the
 * parked mappings they took are made read-write. */
static bool grant_begin(shm_conn *c, const uint8_t *buf, const shm_grant *g, const uint64_t *etok,
                        const int *fds, int nfds, grant_maps *gm, int32_t *es, uint64_t *rids) {
    for (uint32_t i = 0; i < g->ndrop; i++) {
        uint64_t rid = xp_get_u64(g->drops + 8 * (size_t)i);
        shm_map *m;
        if (rid & SHM_DROP_FILE) continue; /* a file: after the entries */
        HASH_FIND(hh, c->maps, &rid, sizeof rid, m);
        if (m && m->base) {
            HASH_DEL(c->maps, m);
            HASH_DELETE(hh_tok, c->by_tok, m);
            m->next = gm->retired;
            gm->retired = m;
        } else if (m) {
            if (m->direct && gm->ngone < SHM_GONE_MAX) {
                gm->gone[gm->ngone] = m->at;
                gm->gone_len[gm->ngone++] = m->maplen;
            }
            map_drop(c, m);
        }
    }
    bool lost_file = grant_map(c, buf, g, etok, fds, nfds, gm, es, rids);
    revive(c, gm->reviving);
    return lost_file;
}

/* The second half, after the copies: what was retired and not taken over
 * is parked or unmapped, then the files of pools that are gone are closed
 * (the entries may still have mapped from them; the target numbers them
 * afresh if it ever sends them again). */
static void grant_end(shm_conn *c, const shm_grant *g, grant_maps *gm) {
    retired_park(c, gm->retired);
    for (uint32_t i = 0; i < g->ndrop; i++) {
        uint64_t d = xp_get_u64(g->drops + 8 * (size_t)i);
        if (d & SHM_DROP_FILE) file_close(c, (uint32_t)d);
    }
}

/* Applies an OFFER of len bytes (fds received with it) like a GRANT with
 * no copies. An offered window already closed when we read the offer (its
 * slot no longer shows it) is retired at once, so that no read-write
 * mapping outlives a window by more than this call. Fails (the connection
 * is then dropped) for a malformed OFFER or one naming a file not held. */
static int offer_apply(shm_conn *c, const uint8_t *buf, size_t len, const int *fds, int nfds) {
    shm_grant g;
    int rc = shm_offer_decode(buf, len, nfds, &g);
    if (rc) {
        for (int i = 0; i < nfds; i++) close(fds[i]);
        return rc;
    }
    uint64_t etok[SHM_CHUNK], rids[SHM_CHUNK];
    int32_t es[SHM_CHUNK];
    uint32_t ipc_seen = 0;
    for (uint32_t i = 0; i < g.n; i++) {
        shm_grant_entry e;
        shm_grant_entry_get(buf, &g, i, &ipc_seen, &e);
        etok[i] = e.key;
    }
    grant_maps gm = {.offer = true, .lone_offer = g.n == 1};
    bool lost_file = grant_begin(c, buf, &g, etok, fds, nfds, &gm, es, rids);
    for (uint32_t i = 0; i < g.n; i++) {
        shm_map *m;
        HASH_FIND(hh, c->maps, &rids[i], sizeof rids[i], m);
        if (!m || !m->base) continue;
        if (__atomic_load_n(&c->seg[m->slot].state, __ATOMIC_SEQ_CST) == ((m->rid << 1) | 1))
            continue;
        HASH_DEL(c->maps, m);
        HASH_DELETE(hh_tok, c->by_tok, m);
        m->next = gm.retired;
        gm.retired = m;
    }
    grant_end(c, &g, &gm);
    if (c->si) __atomic_add_fetch(&c->si->offers, 1, __ATOMIC_RELAXED);
    return lost_file ? ect_set_error(ECT_EPROTO, "shm: an OFFER named a memory file not held here")
                     : 0;
}

/* Receives the next message that is not an OFFER into buf (SHM_GRANT_MAX),
 * applying the OFFERs that come first. */
static int recv_past_offers(ect_xport *x, shm_conn *c, uint8_t *buf, size_t *len, int *fds,
                            int *nfds) {
    for (;;) {
        int rc = shm_msg_recv(c->fd, buf, SHM_GRANT_MAX, len, fds, SHM_CHUNK, nfds, false,
                              x->opts.io_timeout_ms);
        if (rc || shm_msg_magic(buf, *len) != SHM_MAGIC_OFFER) return rc;
        if ((rc = offer_apply(c, buf, *len, fds, *nfds)) != 0) return rc;
    }
}

/* Applies the OFFERs queued on an idle or working connection without
 * waiting, every one (max 0) or up to max: 0 when none is left or max were
 * applied, ECT_ECLOSED at EOF, ECT_EPROTO for any other message (out of
 * protocol between a DONE and the next BEGIN). */
static int drain_offers(shm_conn *c, unsigned max) {
    if (!c->offers) return xp_fd_quiet(c->fd) ? 0 : ECT_ECLOSED;
    if (!c->obuf && !(c->obuf = malloc(SHM_OFFER_MAX))) return ECT_ENOMEM;
    for (unsigned got = 0; !max || got < max; got++) {
        size_t len;
        int fds[SHM_CHUNK], nfds = 0;
        int rc = shm_msg_recv_now(c->fd, c->obuf, SHM_OFFER_MAX, &len, fds, SHM_CHUNK, &nfds);
        if (rc == 1) return 0;
        if (rc) return rc;
        if (shm_msg_magic(c->obuf, len) != SHM_MAGIC_OFFER) {
            for (int i = 0; i < nfds; i++) close(fds[i]);
            return ect_set_error(ECT_EPROTO, "shm: a message out of turn");
        }
        if ((rc = offer_apply(c, c->obuf, len, fds, nfds)) != 0) return rc;
    }
    return 0;
}

/* Leaving the cache: the connection is usable when its next message is an
 * OFFER (applied) or nothing. A lone step's OFFER is all that waits (its
 * reserve reply came after it), so one read, not a second that finds the
 * queue empty; more OFFERs, or an EOF behind one, are read when a write
 * misses its window (write_batch) and after a fast batch. */
static bool conn_alive(xp_conn x) { return drain_offers(x.ctx, 1) == 0; }

/* One BEGIN/GRANT/copy/DONE/ACK round for idx[0..n). Fails only for
 * connection-level errors; per-write refusals go to st. */
static int chunk(ect_xport *x, shm_conn *c, const ect_write *w, const size_t *idx, uint32_t n,
                 const uint64_t *tok, const src_kind *sk, int *st, uint8_t *buf) {
    int to = x->opts.io_timeout_ms;
    shm_begin_entry be[SHM_CHUNK];
    uint64_t etok[SHM_CHUNK];
    for (uint32_t i = 0; i < n; i++) {
        be[i] = (shm_begin_entry){w[idx[i]].dst_addr, w[idx[i]].len, tok[idx[i]]};
        etok[i] = tok[idx[i]];
    }
    size_t len = shm_begin_encode(buf, be, n);
    int rc = shm_msg_send(c->fd, buf, len, NULL, 0, to);
    if (c->si) __atomic_add_fetch(&c->si->begins, 1, __ATOMIC_RELAXED);
    int fds[SHM_CHUNK], nfds = 0;
    if (!rc) rc = recv_past_offers(x, c, buf, &len, fds, &nfds);
    if (rc) return rc;
    shm_grant g;
    if ((rc = shm_grant_decode(buf, len, n, nfds, &g)) != 0) {
        for (int i = 0; i < nfds; i++) close(fds[i]);
        return rc;
    }
    grant_maps gm = {0};
    int32_t es[SHM_CHUNK];
    uint64_t rids[SHM_CHUNK];
    bool lost_file = grant_begin(c, buf, &g, etok, fds, nfds, &gm, es, rids);
    grant_copy(c, w, idx, n, sk, es, rids, st);
    grant_end(c, &g, &gm);
    shm_done_encode(buf, n);
    rc = shm_msg_send(c->fd, buf, SHM_DONE_LEN, NULL, 0, to);
    /* A connection whose files disagree with the target's is dropped; the
     * next batch connects afresh and is sent the fd again. */
    if (!rc && lost_file)
        rc = ect_set_error(ECT_EPROTO, "shm: the target named a memory file not held here");
    return rc;
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
    if (live) rc = put_window(m, a - m->raddr, w->src, w->len, sk->kind, sk->dev);
    __atomic_fetch_sub(&sl->users, 1, __ATOMIC_SEQ_CST);
    return rc;
}

/* fast_copy again for the writes idx[0..m) that missed it; returns how
 * many still miss (left first in idx), counting the copies in *fast. */
static size_t retry_fast(shm_conn *c, const ect_write *w, const uint64_t *tok, const src_kind *sk,
                         size_t *idx, size_t m, int *st, size_t *fast) {
    size_t left = 0;
    for (size_t j = 0; j < m; j++) {
        size_t i = idx[j];
        int f = fast_copy(c, &w[i], tok[i], &sk[i]);
        if (f == 0)
            (*fast)++;
        else if (f < 0)
            st[i] = f;
        else
            idx[left++] = i;
    }
    return left;
}

/* A cached connection only (ready_only: 1 when there is none), or a new
 * one. */
static int conn_for(ect_xport *x, xp_peer *p, bool ready_only, shm_conn **out) {
    if (!ready_only) return take_conn(x, p, out);
    xp_conn cached;
    if (!xp_cache_take(&((shm_impl *)x->impl)->cache, p, &cached)) return 1;
    *out = cached.ctx;
    return 0;
}

/* write_batch, and with ready_only write_ready: only the fast-path copies,
 * the rest left at st 1. */
static int write_batch(ect_xport *x, const char *session, const ect_write *w, size_t n, int *st,
                       bool ready_only) {
    shm_impl *s = x->impl;
    xp_peer *p = NULL;
    shm_conn *c = NULL;
    int rc = xp_cache_peer(&s->cache, session, &p);
    if (!rc) rc = conn_for(x, p, ready_only, &c);
    if (rc) { /* ready_only: left to write_batch, which reports it */
        for (size_t i = 0; i < n; i++) st[i] = ready_only ? 1 : rc;
        return ready_only ? 0 : rc;
    }
    uint64_t *tok = malloc(n * sizeof *tok);
    size_t *idx = malloc(n * sizeof *idx);
    src_kind *sk = calloc(n, sizeof *sk);
    uint8_t *buf = NULL; /* a chunk's messages: only when one is needed */
    if (!tok || !idx || !sk) {
        free(tok);
        free(idx);
        free(sk);
        xp_cache_give(&s->cache, p, (xp_conn){c->fd, c});
        return ect_set_error(ECT_ENOMEM, "batch");
    }
    size_t m = 0, fast = 0;
    bool cu = cuda_active(); /* once a batch: it walks the loaded objects */
    for (size_t i = 0; i < n; i++) {
        if (cu && w[i].len && mem_is_device(w[i].src, &sk[i].dev)) sk[i].kind = ECT_MEM_CUDA;
        int f;
        st[i] = 0;
        if (xp_key_parse(w[i].dst_key, &tok[i]) != 0)
            st[i] = ECT_EINVAL;
        else if ((f = fast_copy(c, &w[i], tok[i], &sk[i])) == 0)
            fast++;
        else if (f < 0)
            st[i] = f;
        else
            idx[m++] = i;
    }
    /* Windows offered behind the OFFER read on leaving the cache. */
    rc = m && c->offers ? drain_offers(c, 0) : 0;
    if (rc == ECT_ECLOSED) rc = ect_set_error(rc, "shm: %s went away", session);
    if (!rc && m && c->offers) m = retry_fast(c, w, tok, sk, idx, m, st, &fast);
    if (!rc && m && !ready_only && !(buf = malloc(SHM_GRANT_MAX)))
        rc = ect_set_error(ECT_ENOMEM, "batch");
    for (size_t i = 0; rc && i < n; i++)
        if (st[i] == 0) st[i] = rc;
    for (size_t i = 0; ready_only && i < m; i++) st[idx[i]] = 1;
    for (size_t done = 0; done < m && !rc && !ready_only;) {
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
     * count as having received them (offers that came meanwhile are
     * applied on the way). */
    if (!rc && fast && drain_offers(c, 0) != 0) {
        rc = ect_set_error(ECT_ECLOSED, "shm: %s went away during the batch", session);
        for (size_t i = 0; i < n; i++)
            if (st[i] == 0) st[i] = rc;
    }
    if (rc)
        conn_free(c);
    else
        xp_cache_give(&s->cache, p, (xp_conn){c->fd, c});
    free(tok);
    free(idx);
    free(sk);
    free(buf);
    return rc;
}

int shm_write_batch(ect_xport *x, const char *session, const ect_write *w, size_t n, int *st) {
    return write_batch(x, session, w, n, st, false);
}

int shm_write_ready(ect_xport *x, const char *session, const ect_write *w, size_t n, int *st) {
    return write_batch(x, session, w, n, st, true);
}

uint64_t shm_direct_count(ect_xport *x) {
    return __atomic_load_n(&((shm_impl *)x->impl)->directs, __ATOMIC_RELAXED);
}

void shm_counts(ect_xport *x, uint64_t *begins, uint64_t *offers) {
    shm_impl *s = x->impl;
    *begins = __atomic_load_n(&s->begins, __ATOMIC_RELAXED);
    *offers = __atomic_load_n(&s->offers, __ATOMIC_RELAXED);
}
