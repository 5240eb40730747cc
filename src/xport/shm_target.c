/*
 * shm_target — the target side of the shm transport: the listening socket,
 * one control segment per connection, a slot per registered region, and the
 * connection threads that grant writes (docs/PROTOCOL.md "shm").
 *
 * For each chunk of a batch the initiator asks (BEGIN) and the target checks
 * key and range, takes a reference on the region for each accepted write and
 * answers (GRANT), attaching a region's fd (or, for CUDA memory, its IPC
 * record) the first time the connection is granted that region; the
 * initiator copies and says DONE; the target drops the references. So
 * unregister waits for copies in progress, exactly as for tcp receives.
 * Towards an initiator that said SHM_HELLO_FILES a pool's fd is attached
 * once per connection, numbered; later windows of the pool name the number
 * (conn_sent), and the pool's end is a file drop. The
 * fast path (a region mapped before) asks nothing: unregister clears the
 * region's state in every segment, then waits for the segments' `users` to
 * drain. A connection whose initiator sent an ID (offers) can also be given
 * windows unasked, from the control server's thread (shm_target_offer): an
 * OFFER built and sent under the connection's lock, as every GRANT is, never
 * waited for, and undone in the connection's sets when it cannot be sent.
 */
#include <pthread.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "mem/cuda.h"
#include "mem/memkind.h"
#include "util/util.h"
#include "xport/auth.h"
#include "xport/shm.h"

typedef struct sent_ids {
    uint64_t *v;
    size_t n, cap;
} sent_ids;

/* A pool's memory file as this connection's initiator holds it (with
 * SHM_HELLO_FILES): attached once, then named by its number. */
typedef struct sent_file {
    uint64_t pool_id; /* the pool region the windows lie in */
    uint32_t num;     /* the file number the initiator knows it by */
} sent_file;

/* What this connection's initiator was given. */
struct conn_sent {
    sent_ids ids;     /* regions granted and not yet dropped, sorted */
    uint64_t gone_seen; /* the regions' gone log read up to here (take_drops) */
    sent_file *files; /* memory files held (files capability only) */
    size_t nfiles, capfiles;
    uint32_t next_file; /* the last file number handed out */
    bool use_files;     /* the initiator said SHM_HELLO_FILES */
};
typedef struct conn_sent conn_sent;

/* A copy of a conn_sent's sets, to put back when an OFFER could not be
 * sent (the initiator then was given nothing). */
typedef struct sent_copy {
    uint64_t *ids;
    size_t nids;
    uint64_t gone_seen;
    sent_file *files;
    size_t nfiles;
    uint32_t next_file;
} sent_copy;

static void sent_free(sent_copy *k) {
    free(k->ids);
    free(k->files);
}

static bool sent_save(const conn_sent *cs, sent_copy *k) {
    k->ids = malloc((cs->ids.n ? cs->ids.n : 1) * sizeof *k->ids);
    k->files = malloc((cs->nfiles ? cs->nfiles : 1) * sizeof *k->files);
    if (!k->ids || !k->files) {
        free(k->ids);
        free(k->files);
        return false;
    }
    if (cs->ids.n) memcpy(k->ids, cs->ids.v, cs->ids.n * sizeof *k->ids);
    if (cs->nfiles) memcpy(k->files, cs->files, cs->nfiles * sizeof *k->files);
    k->nids = cs->ids.n;
    k->gone_seen = cs->gone_seen;
    k->nfiles = cs->nfiles;
    k->next_file = cs->next_file;
    return true;
}

/* Puts the saved sets back (their arrays only grew since the save). */
static void sent_restore(conn_sent *cs, sent_copy *k) {
    if (k->nids) memcpy(cs->ids.v, k->ids, k->nids * sizeof *k->ids);
    cs->ids.n = k->nids;
    cs->gone_seen = k->gone_seen; /* the drops read since are listed again */
    if (k->nfiles) memcpy(cs->files, k->files, k->nfiles * sizeof *k->files);
    cs->nfiles = k->nfiles;
    cs->next_file = k->next_file;
    sent_free(k);
}

/* Where id is in the sorted set, or would go. */
static size_t sent_pos(const sent_ids *s, uint64_t id) {
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->v[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool sent_has(const sent_ids *s, uint64_t id) {
    size_t i = sent_pos(s, id);
    return i < s->n && s->v[i] == id;
}

/* Adds id (not in the set). Ids grow with each region and window opened,
 * so this is an append as a rule. */
static bool sent_add(sent_ids *s, uint64_t id) {
    if (s->n == s->cap) {
        size_t nc = s->cap ? 2 * s->cap : 16;
        uint64_t *nv = realloc(s->v, nc * sizeof *nv);
        if (!nv) return false;
        s->v = nv;
        s->cap = nc;
    }
    size_t i = sent_pos(s, id);
    memmove(&s->v[i + 1], &s->v[i], (s->n - i) * sizeof *s->v);
    s->v[i] = id;
    s->n++;
    return true;
}

/* Takes id out of the set; false when it was not there. */
static bool sent_del(sent_ids *s, uint64_t id) {
    size_t i = sent_pos(s, id);
    if (i >= s->n || s->v[i] != id) return false;
    memmove(&s->v[i], &s->v[i + 1], (s->n - i - 1) * sizeof *s->v);
    s->n--;
    return true;
}

/* The number of the memory file of pool `pool_id` the initiator holds, or 0. */
static uint32_t file_held(const conn_sent *cs, uint64_t pool_id) {
    for (size_t i = 0; i < cs->nfiles; i++)
        if (cs->files[i].pool_id == pool_id) return cs->files[i].num;
    return 0;
}

/* Records that the fd attached now is pool `pool_id`'s file: its number,
 * or 0 when out of memory (then the fd travels without one, as before). */
static uint32_t file_add(conn_sent *cs, uint64_t pool_id) {
    if (cs->next_file == UINT32_MAX) return 0;
    if (cs->nfiles == cs->capfiles) {
        size_t nc = cs->capfiles ? 2 * cs->capfiles : 4;
        sent_file *nv = realloc(cs->files, nc * sizeof *nv);
        if (!nv) return 0;
        cs->files = nv;
        cs->capfiles = nc;
    }
    cs->files[cs->nfiles++] = (sent_file){pool_id, ++cs->next_file};
    return cs->next_file;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The ids of every registered region and open window, sorted (one pass
 * under the lock, so a walk's drop list costs O(n log n), not
 * O(sent x regions)), and the gone log's count as of that pass in *seq.
 * NULL with *n = 0 when empty or out of memory. */
static uint64_t *alive_ids(xp_regions *t, size_t *n, uint64_t *seq) {
    xp_region *r, *tmp;
    pthread_mutex_lock(&t->mu);
    size_t cnt = HASH_COUNT(t->by_token), k = 0;
    uint64_t *v = cnt ? malloc(cnt * sizeof *v) : NULL;
    if (v) {
        HASH_ITER(hh, t->by_token, r, tmp) v[k++] = r->id;
    }
    *seq = t->gone_seq;
    pthread_mutex_unlock(&t->mu);
    if (v) qsort(v, k, sizeof *v, cmp_u64);
    *n = k;
    return v;
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
    /* An offer that found the connection before it left the list may still
     * hold its lock: wait it out. */
    pthread_mutex_lock(&g->mu);
    pthread_mutex_unlock(&g->mu);
    munmap(g->slots, SHM_SEG_LEN);
}

/* What travels with the first grant of region r on this connection: its
 * IPC record (CUDA), its fd, or, for a window of a pool whose memory file
 * the initiator already holds, that file's number and no fd. */
static void attach(conn_sent *cs, const xp_region *r, shm_grant_entry *e, uint8_t *ipc,
                   uint32_t *nipc, int *fds, int *nfds) {
    if (r->kind == ECT_MEM_CUDA) {
        shm_grant_put_ipc(ipc + SHM_IPC_LEN * (size_t)(*nipc)++, r->ipc, r->ipc_off,
                          shm_process_token(), (uint32_t)r->device);
        e->flags = SHM_GF_IPC;
        return;
    }
    if (cs->use_files && r->parent && (e->file = file_held(cs, r->parent->id)) != 0) {
        e->flags = SHM_GF_FILE;
        return;
    }
    if (cs->use_files && r->parent) e->file = file_add(cs, r->parent->id);
    fds[(*nfds)++] = r->fd;
    e->flags = SHM_GF_FD;
}

/* A drop for gone region `id`, when this connection was given it: the
 * region to unmap, or the pool's memory file to close. Returns the count
 * listed (0 or 1). */
static uint32_t drop_if_sent(conn_sent *cs, uint64_t id, uint64_t *drop) {
    if (sent_del(&cs->ids, id)) {
        *drop = id;
        return 1;
    }
    for (size_t i = 0; i < cs->nfiles; i++)
        if (cs->files[i].pool_id == id) {
            *drop = SHM_DROP_FILE | cs->files[i].num;
            cs->files[i] = cs->files[--cs->nfiles];
            return 1;
        }
    return 0;
}

/* take_drops from the regions' gone log: the ids gone since this
 * connection last read it, each looked up in its sets (O(gone x log sent),
 * not a walk of every region open). False, nothing read, when it fell more
 * than XP_GONE_LOG behind. */
static bool drops_from_log(xp_regions *t, conn_sent *cs, uint64_t *drops, uint32_t *ndrop) {
    pthread_mutex_lock(&t->mu);
    bool fits = t->gone_seq - cs->gone_seen <= XP_GONE_LOG;
    for (; fits && cs->gone_seen < t->gone_seq && *ndrop < SHM_MAX_DROP; cs->gone_seen++)
        *ndrop += drop_if_sent(cs, t->gone[cs->gone_seen % XP_GONE_LOG], &drops[*ndrop]);
    pthread_mutex_unlock(&t->mu);
    return fits;
}

/* take_drops by a walk of every region alive: what was given and is not
 * among them. The log counts as read once the walk listed every drop. */
static uint32_t drops_from_walk(xp_regions *t, conn_sent *cs, uint64_t *drops) {
    sent_ids *sent = &cs->ids;
    uint32_t ndrop = 0;
    size_t nalive = 0, keep = 0;
    uint64_t seq;
    uint64_t *alive = alive_ids(t, &nalive, &seq);
    /* (Out of memory: nothing counts as alive, so the peer unmaps what it was
     * given and is granted it again on its next write: slower, still safe.) */
    for (size_t i = 0; i < sent->n; i++) { /* in order: the set stays sorted */
        bool live = alive && bsearch(&sent->v[i], alive, nalive, sizeof *alive, cmp_u64);
        if (live || ndrop == SHM_MAX_DROP)
            sent->v[keep++] = sent->v[i];
        else
            drops[ndrop++] = sent->v[i];
    }
    sent->n = keep;
    for (size_t i = 0; i < cs->nfiles && ndrop < SHM_MAX_DROP;) {
        if (alive && bsearch(&cs->files[i].pool_id, alive, nalive, sizeof *alive, cmp_u64)) {
            i++;
            continue;
        }
        drops[ndrop++] = SHM_DROP_FILE | cs->files[i].num;
        cs->files[i] = cs->files[--cs->nfiles];
    }
    free(alive);
    if (ndrop < SHM_MAX_DROP) cs->gone_seen = seq; /* every drop listed */
    return ndrop;
}

/* Lists (in drops, at most SHM_MAX_DROP) what this connection's initiator
 * was given that is gone (regions to unmap, pools' files to close) and
 * forgets it. Returns the count. */
static uint32_t take_drops(ect_xport *x, conn_sent *cs, uint64_t *drops) {
    uint32_t ndrop = 0;
    if (drops_from_log(&x->regs, cs, drops, &ndrop)) return ndrop;
    __atomic_fetch_add(&((shm_impl *)x->impl)->drop_walks, 1, __ATOMIC_RELAXED);
    return drops_from_walk(&x->regs, cs, drops);
}

/* Grants one BEGIN of n entries (in `in`) into `out`: takes a reference on
 * each accepted write's region (held[i]), attaches what the connection has
 * not been given yet and lists what it was given that is gone. Returns the
 * GRANT's length and its fds, or 0 when out of memory. */
static size_t grant(ect_xport *x, const uint8_t *in, uint32_t n, uint8_t *out, uint8_t *ipc,
                    xp_region **held, conn_sent *cs, int *fds, int *nfds) {
    uint32_t ndrop, nipc = 0;
    sent_ids *sent = &cs->ids;
    *nfds = 0;
    for (uint32_t i = 0; i < n; i++) {
        shm_begin_entry b;
        shm_begin_entry_get(in, i, &b);
        shm_grant_entry e = {0};
        xp_region *r = NULL;
        e.status = xp_region_acquire(&x->regs, b.token, b.addr, b.len, &r);
        held[i] = r;
        if (r) {
            if (!sent_has(sent, r->id)) {
                if (!sent_add(sent, r->id)) return 0;
                attach(cs, r, &e, ipc, &nipc, fds, nfds);
            }
            e.rid = r->id;
            e.raddr = (uint64_t)(uintptr_t)r->addr;
            e.rlen = r->len;
            e.fd_off = r->fd_off;
            e.slot = (uint32_t)((uintptr_t)r->be - 1);
        }
        shm_grant_put_entry(out, i, &e);
    }
    /* Regions this connection was given that are gone: tell it to unmap;
     * pools gone: tell it to close their files. */
    uint64_t drops[SHM_MAX_DROP];
    ndrop = take_drops(x, cs, drops);
    for (uint32_t k = 0; k < ndrop; k++) shm_grant_put_drop(out, n, k, drops[k]);
    return shm_grant_finish(out, n, ndrop, (uint32_t)*nfds, ipc, nipc);
}

static void release_held(ect_xport *x, xp_region **held, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (held[i]) xp_region_release(&x->regs, held[i]);
    memset(held, 0, sizeof *held * n);
}

/* The initiator's ID message, right after a HELLO reply that said offers:
 * from now on its reserve requests may name the connection. */
static int read_id(shm_impl *si, shm_seg *seg, uint8_t *in, int to) {
    size_t len;
    uint64_t id;
    int rc = shm_msg_recv(seg->fd, in, SHM_BEGIN_MAX, &len, NULL, 0, NULL, false, to);
    if (!rc && (rc = shm_id_decode(in, len, &id)) != 0)
        ECT_LOGW("xport", "shm target: %s; closing", ect_last_error());
    if (rc) return rc;
    pthread_mutex_lock(&si->smu);
    seg->init_id = id;
    pthread_mutex_unlock(&si->smu);
    return 0;
}

static void serve_conn(void *ctx, int fd, int stopfd) {
    ect_xport *x = ctx;
    pthread_setname_np(pthread_self(), "ect-shm-target");
    shm_impl *si = x->impl;
    shm_seg seg = {0};
    int segfd = -1;
    int to = x->opts.io_timeout_ms;
    uint8_t *in = malloc(SHM_BEGIN_MAX), *out = malloc(SHM_GRANT_MAX);
    uint8_t *ipc = malloc(SHM_IPC_LEN * SHM_CHUNK);
    xp_region **held = calloc(SHM_CHUNK, sizeof *held);
    conn_sent cs = {0};
    size_t len;
    seg.fd = fd;
    seg.cs = &cs;
    pthread_mutex_init(&seg.mu, NULL);
    (void)stopfd; /* the server's stop shuts the socket down, which ends recvmsg */
    if (!in || !out || !ipc || !held || !shm_same_uid(fd)) goto done;
    shm_set_timeouts(fd, to);
    /* The hello must come within io_timeout_ms (a silent peer is dropped). */
    if (shm_msg_recv(fd, in, SHM_BEGIN_MAX, &len, NULL, 0, NULL, false, to) != 0 ||
        shm_hello_decode(in, len) != 0) {
        ECT_LOGW("xport", "shm target: bad hello; closing");
        goto done;
    }
    /* Keys: the handshake comes before the control segment or any grant
     * is handed out; keys on one side only are refused with a RESULT frame
     * that says so. */
    bool wants_auth = xp_get_u16(in + 6) & SHM_HELLO_AUTH;
    cs.use_files = xp_get_u16(in + 6) & SHM_HELLO_FILES;
    uint16_t offers = shm_hello_flags(in) & SHM_HELLO_OFFERS;
    if (x->keys || wants_auth) {
        uint8_t f[XP_AUTH_LEN];
        const char *why = NULL;
        if (!x->keys) {
            why = "it asks for an authenticated session and this target has no data-plane keys";
            xp_auth_encode_refusal(f, XP_AUTH_NO_KEYS);
        } else if (!wants_auth) {
            why = "it has no data-plane keys and this target requires them (curve_keys)";
            xp_auth_encode_refusal(f, XP_AUTH_KEYS_REQUIRED);
        }
        char peer[80];
        xp_peer_name(fd, peer, sizeof peer);
        if (why) {
            shm_msg_send(fd, f, sizeof f, NULL, 0, to);
            xp_auth_refused_log(x, peer, why);
            goto done;
        }
        shm_auth_io io = {fd, to};
        xp_auth_io aio = {shm_auth_send, shm_auth_recv, &io};
        int who;
        if (xp_auth_target(x->keys, &aio, &who) != 0) {
            xp_auth_refused_log(x, peer, ect_last_error());
            goto done;
        }
        ECT_LOGD("xport", "shm target: peer authenticated as \"%s\"", x->keys->accept_names[who]);
    }
    /* The hello reply carries the connection's control segment. */
    if (seg_open(si, &seg, &segfd) != 0) goto done;
    shm_hello_reply_encode(in, offers);
    int hrc = shm_msg_send(fd, in, SHM_HELLO_REPLY_LEN, &segfd, 1, to);
    close(segfd);
    if (hrc != 0 || (offers && read_id(si, &seg, in, to) != 0)) goto done;
    for (;;) {
        uint32_t n;
        if (shm_msg_recv(fd, in, SHM_BEGIN_MAX, &len, NULL, 0, NULL, true, to) != 0) break;
        if (shm_begin_decode(in, len, &n) != 0) {
            ECT_LOGW("xport", "shm target: %s; closing", ect_last_error());
            break;
        }
        int fds[SHM_CHUNK], nfds;
        /* Built and sent under the connection's lock: an OFFER's file
         * numbers and drops must reach the initiator in the order the
         * connection's sets changed. */
        pthread_mutex_lock(&seg.mu);
        size_t glen = grant(x, in, n, out, ipc, held, &cs, fds, &nfds);
        int rc = glen ? shm_msg_send(fd, out, glen, fds, nfds, to) : ECT_ENOMEM;
        pthread_mutex_unlock(&seg.mu);
        /* The initiator copies now; wait for DONE within the io timeout.
         * DONE is not answered: the bytes landed when the initiator's copy
         * returned, and DONE only ends the references. */
        if (!rc) rc = shm_msg_recv(fd, in, SHM_BEGIN_MAX, &len, NULL, 0, NULL, false, to);
        if (!rc) rc = shm_done_decode(in, len, n);
        release_held(x, held, n);
        if (rc) break;
    }
done:
    if (seg.slots) seg_close(si, &seg);
    free(in);
    free(out);
    free(ipc);
    free(held);
    free(cs.ids.v);
    free(cs.files);
    free(seg.obuf); /* seg_close waited out any offer */
    pthread_mutex_destroy(&seg.mu);
}

/* ---- offers (docs/PROTOCOL.md "shm", "Offers") */

/* Offers skipped because the connection was busy or its socket full (the
 * initiator asks with a BEGIN instead), in this process: tests account for
 * every BEGIN with it. */
static uint64_t offer_skips;

uint64_t shm_offer_skips(void) { return __atomic_load_n(&offer_skips, __ATOMIC_RELAXED); }

static void offer_skipped(void) { __atomic_fetch_add(&offer_skips, 1, __ATOMIC_RELAXED); }

/* The one live connection whose initiator sent ID `id`, locked; NULL when
 * none, several, or it is busy (*busy: granting; the offer is skipped,
 * never waited for, and counted). */
static shm_seg *offer_conn(shm_impl *si, uint64_t id, bool *busy) {
    shm_seg *found = NULL;
    int n = 0;
    pthread_mutex_lock(&si->smu);
    for (shm_seg *g = si->segs; g; g = g->next)
        if (g->init_id == id && n++ == 0) found = g;
    if (n != 1) {
        found = NULL;
    } else if (pthread_mutex_trylock(&found->mu) != 0) {
        found = NULL;
        *busy = true;
        offer_skipped();
    }
    pthread_mutex_unlock(&si->smu);
    return found;
}

/* The live host window whose key is `key`, with a reference held; NULL
 * for anything else (a region, CUDA memory, a closed or unknown key). */
static xp_region *offer_window(ect_xport *x, const char *key) {
    uint64_t tok;
    if (xp_key_parse(key, &tok) != 0) return NULL;
    xp_region *r;
    pthread_mutex_lock(&x->regs.mu);
    HASH_FIND(hh, x->regs.by_token, &tok, sizeof tok, r);
    if (r && (!r->parent || r->dead || r->kind == ECT_MEM_CUDA || r->fd < 0)) r = NULL;
    if (r) r->refs++;
    pthread_mutex_unlock(&x->regs.mu);
    return r;
}

/* Builds the OFFER of the windows keys[0..n) the connection was not given
 * yet (references in held[], *nheld) and its drops into out; returns its
 * length, 0 when there is nothing to offer or out of memory. */
static size_t offer_build(ect_xport *x, conn_sent *cs, const char *const *keys, size_t n,
                          uint8_t *out, xp_region **held, uint32_t *nheld, int *fds, int *nfds) {
    uint32_t k = 0;
    *nfds = 0;
    for (size_t i = 0; i < n && *nheld < SHM_CHUNK; i++) {
        xp_region *r = offer_window(x, keys[i]);
        if (!r) continue;
        held[(*nheld)++] = r;
        if (sent_has(&cs->ids, r->id)) continue; /* granted before: the fast path has it */
        if (!sent_add(&cs->ids, r->id)) return 0;
        shm_grant_entry e = {.key = r->token,
                             .rid = r->id,
                             .raddr = (uint64_t)(uintptr_t)r->addr,
                             .rlen = r->len,
                             .fd_off = r->fd_off,
                             .slot = (uint32_t)((uintptr_t)r->be - 1)};
        attach(cs, r, &e, NULL, NULL, fds, nfds);
        shm_offer_put_entry(out, k++, &e);
    }
    if (!k) return 0;
    uint64_t drops[SHM_MAX_DROP];
    uint32_t ndrop = take_drops(x, cs, drops);
    for (uint32_t d = 0; d < ndrop; d++) shm_offer_put_drop(out, k, d, drops[d]);
    return shm_offer_finish(out, k, ndrop, (uint32_t)*nfds);
}

int shm_target_offer(ect_xport *x, uint64_t id, const char *const *keys, size_t n) {
    shm_impl *si = x->impl;
    if (!id || !n) return 0;
    bool busy = false;
    shm_seg *g = offer_conn(si, id, &busy);
    if (busy) return ect_set_error(ECT_EBUSY, "shm: the connection to offer to is busy");
    if (!g) return ect_set_error(ECT_ENOTFOUND, "shm: no one connection to offer to");
    if (!g->obuf) g->obuf = malloc(SHM_OFFER_MAX);
    uint8_t *out = g->obuf;
    xp_region *held[SHM_CHUNK];
    uint32_t nheld = 0;
    int fds[SHM_CHUNK], nfds = 0, rc = ECT_ENOMEM;
    sent_copy saved;
    if (out && sent_save(g->cs, &saved)) {
        size_t len = offer_build(x, g->cs, keys, n, out, held, &nheld, fds, &nfds);
        /* Never waits: a full socket (the initiator is not reading) means no
         * offer; the initiator asks with a BEGIN as before. */
        rc = len ? shm_msg_send(g->fd, out, len, fds, nfds, 0) : 0;
        if (!len) sent_restore(g->cs, &saved); /* nothing new, or out of memory */
        if (len && rc) {
            sent_restore(g->cs, &saved);
            offer_skipped();
        }
        else if (len)
            sent_free(&saved);
    }
    pthread_mutex_unlock(&g->mu);
    release_held(x, held, nheld);
    return rc;
}

uint64_t shm_target_drop_walks(ect_xport *x) {
    return __atomic_load_n(&((shm_impl *)x->impl)->drop_walks, __ATOMIC_RELAXED);
}

/* A region gets a slot; every connection's segment shows it registered. A
 * CUDA region also gets its IPC handle, handed to peers in the GRANT. */
int shm_target_reg(ect_xport *x, xp_region *r) {
    shm_impl *s = x->impl;
    if (r->kind == ECT_MEM_CUDA) {
        int rc = cuda_ipc_export(r->addr, r->ipc, &r->ipc_off);
        if (rc) return ect_set_error(rc, "shm: %s", ect_last_error());
    }
    int slot = -1;
    pthread_mutex_lock(&s->smu);
    /* A free slot: no region, and no copy of a closed window's still in
     * progress in any connection's segment (window close does not wait).
     * Next fit, from after the slot taken last: windows close about in the
     * order they opened, so the next slot is free as a rule and a window
     * costs one probe, not a scan past every window open. */
    for (int k = 0; k < SHM_SLOTS && slot < 0; k++) {
        int i = (s->slot_next + k) % SHM_SLOTS;
        if (s->slot_state[i] != 0) continue;
        bool users = false;
        for (shm_seg *g = s->segs; g && !users; g = g->next)
            users = __atomic_load_n(&g->slots[i].users, __ATOMIC_SEQ_CST) != 0;
        if (!users) slot = i;
    }
    if (slot >= 0) {
        s->slot_next = (slot + 1) % SHM_SLOTS;
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
void shm_target_unreg(ect_xport *x, xp_region *r) {
    shm_impl *s = x->impl;
    int slot = (int)((uintptr_t)r->be - 1);
    pthread_mutex_lock(&s->smu);
    s->slot_state[slot] = 0;
    for (shm_seg *g = s->segs; g; g = g->next)
        __atomic_store_n(&g->slots[slot].state, 0, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&s->smu);
    if (r->parent) return; /* a window: closing never waits (reg skips slots in use) */
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

/* Listens on the abstract name and starts the connection server. */
int shm_target_open(ect_xport *x, shm_impl *s, const char *name) {
    struct sockaddr_un sa;
    socklen_t sl;
    int rc = shm_make_addr(name, &sa, &sl);
    if (rc) return rc;
    int lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (lfd < 0) return ect_set_errno(errno, "shm: socket");
    if (bind(lfd, (struct sockaddr *)&sa, sl) != 0 || listen(lfd, 64) != 0) {
        rc = ect_set_errno(errno, "shm: listen on @%s", name);
        close(lfd);
        return rc;
    }
    return xp_server_start(lfd, serve_conn, x, x->opts.max_conns, x->opts.max_conns_per_peer,
                           &s->srv);
}
