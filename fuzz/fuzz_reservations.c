/*
 * fuzz_reservations — random operation sequences against the reservation
 * table's invariants. Each input byte pair is one op (reserve, complete,
 * cancel with any flags, take, release, reap, event pops, eviction, spare
 * ranges granted and bound, the ready listing of ect_ready) on a
 * small pool where conflicts, followers, reclaim and tombstone caps are
 * frequent. A fake pool aborts on a double free, on a free of an unknown
 * range, and on freeing a range a writer was given and has not settled;
 * after every op rsv_check must pass and the bytes held must match the pool.
 * At the end every writer settles and the pool must come back to zero.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "push/reservations.h"

#define SLOTS 6
#define UNIT 128
#define NIDS 8

typedef struct {
    bool live[SLOTS], writing[SLOTS];
    uint64_t size[SLOTS];
    uint64_t used;
} pool;

static pool P;

static void check(bool ok) {
    if (!ok) abort(); /* not a trap: UCX catches SIGILL */
}

static int p_alloc(void *ctx, uint64_t nbytes, uint64_t *off) {
    (void)ctx;
    if (nbytes > UNIT) return ECT_EINVAL;
    for (int i = 0; i < SLOTS; i++)
        if (!P.live[i]) {
            P.live[i] = true;
            P.writing[i] = false;
            P.size[i] = nbytes;
            P.used += nbytes;
            *off = (uint64_t)i * UNIT;
            return 0;
        }
    return ECT_EFULL;
}

static void p_free(void *ctx, uint64_t off, uint64_t nbytes) {
    (void)ctx;
    check(off % UNIT == 0 && off / UNIT < SLOTS);
    int i = (int)(off / UNIT);
    check(P.live[i] && P.size[i] == nbytes && !P.writing[i]);
    P.live[i] = false;
    P.used -= nbytes;
}

static bool p_active(void *ctx, uint64_t off, uint64_t nbytes) {
    (void)ctx;
    (void)nbytes;
    return P.writing[off / UNIT];
}

static const rsv_mem_ops OPS = {p_alloc, p_free, NULL};
static const rsv_mem_ops OPS_ACTIVE = {p_alloc, p_free, p_active};

/* rsv_ready_list (ect_ready): every item listed is READY, seqs ascend, at
 * most max are listed (max of them when more remain), and next is not
 * below the last one listed. */
typedef struct {
    rsv_table *t;
    uint64_t prev;
} list_ctx;

static void on_listed(void *ctx, const char *tid, uint64_t seq, const rsv_status *st) {
    list_ctx *l = ctx;
    rsv_status now;
    check(seq > l->prev && st->state == RSV_READY);
    check(rsv_status_get(l->t, tid, &now) == 0 && now.state == RSV_READY);
    l->prev = seq;
}

static void fuzz_ready_list(rsv_table *t, uint8_t b, uint64_t now) {
    uint64_t after = b >> 2 & 7, next = 0;
    bool more = false;
    list_ctx l = {t, 0};
    size_t max = 1 + (b >> 5 & 3);
    size_t n = rsv_ready_list(t, after, (b & 2) ? 3 : 0, max, now, on_listed, &l, &next, &more);
    check(n <= max && (!more || n == max) && next >= l.prev);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    memset(&P, 0, sizeof P);
    ect_log_set_level(ECT_LOG_ERROR);
    rsv_opts o;
    rsv_opts_init(&o);
    o.mem = (data[0] & 1) ? &OPS_ACTIVE : &OPS;
    o.ttl_ms = 20 + (data[0] >> 4);
    o.pending_grace_ms = 10;
    o.max_tombstones = 1 + ((data[0] >> 1) & 7);
    o.max_events = 1 + ((data[0] >> 2) & 3);
    o.capacity = (data[0] & 8) ? 64 : 0; /* larger items: "more than the whole pool" */
    rsv_table *t;
    if (rsv_open(&o, &t)) return 0;
    char rid[NIDS][ECT_ID_LEN + 1];
    int wslot[NIDS];
    memset(rid, 0, sizeof rid);
    for (int i = 0; i < NIDS; i++) wslot[i] = -1;
    uint64_t now = 0;
    char sid[2][ECT_ID_LEN + 1]; /* the latest spare granted to owner A / B */
    memset(sid, 0, sizeof sid);
    for (size_t i = 1; i + 1 < size; i += 2) {
        uint8_t a = data[i], b = data[i + 1];
        unsigned k = a & 7, op = a >> 3 & 15;
        char tid[4] = {'t', (char)('0' + k), 0}, hash[4] = {'h', (char)('0' + (b & 3)), 0};
        now += b >> 5;
        rsv_reply r;
        rsv_status st;
        bool c, br;
        switch (op) {
        case 0:
        case 1:
        case 2: {
            uint64_t shape[1] = {(uint64_t)(b >> 2 & 7) * 4};
            rsv_request q = {tid, hash, shape[0] * 4, shape, 1, (b & 4) ? "float32" : "int32",
                             NULL};
            if (rsv_reserve(t, &q, now, &r) == 0) {
                if (!r.cancelled) memcpy(rid[k], r.reservation_id, sizeof rid[k]);
                if (r.write) {
                    wslot[k] = (int)(r.offset / UNIT);
                    P.writing[wslot[k]] = true;
                }
            }
            break;
        }
        case 3:
        case 4: /* the writer completes once its write landed */
            if (wslot[k] >= 0) P.writing[wslot[k]] = false, wslot[k] = -1;
            rsv_complete(t, tid, (b & 2) ? "bogus" : rid[k], now, &c, &br);
            break;
        case 5: /* abandon (maybe refresh): the producer stopped writing */
            if (wslot[k] >= 0) P.writing[wslot[k]] = false, wslot[k] = -1;
            (void)rsv_cancel(t, tid, (b & 1) ? NULL : rid[k], true, b & 2, now, &c);
            break;
        case 6: (void)rsv_cancel(t, tid, (b & 1) ? NULL : rid[k], false, b & 2, now, &c); break;
        case 7: /* take; maybe release; maybe finish (the engine is done with it) */
            if (rsv_take(t, tid, now, &st) == 0 && (b & 1)) {
                check(rsv_release(t, st.mm_hash, now) == 0);
                if (b & 2) check(rsv_finish(t, tid, now) == 0);
            }
            break;
        case 8: (void)rsv_release(t, hash, now); break;
        case 9: rsv_reap(t, now + (b & 31)); break;
        case 10:
            while (rsv_event_peek(t) && b--) rsv_event_pop(t);
            break;
        case 11: rsv_evict_resident(t, b & 3); break;
        case 12:
            if (b & 1)
                fuzz_ready_list(t, b, now);
            else
                (void)rsv_status_get(t, tid, &st);
            break;
        case 13: (void)rsv_finish(t, tid, now); break;
        case 14: /* a spare for owner A or B (docs/PROTOCOL.md "a spare range granted ahead") */
            if (rsv_spare_grant(t, (b & 1) ? "B" : "A", 1 + (b >> 1 & 15) * 8, now, &r) == 0)
                memcpy(sid[b & 1], r.reservation_id, sizeof sid[b & 1]);
            break;
        case 15: { /* bind a spare (maybe another owner's) to item k: it is then written */
            uint64_t shape[1] = {(uint64_t)(b >> 4 & 3) * 4};
            rsv_request q = {tid, hash, shape[0] * 4, shape, 1, "int32", NULL};
            if (rsv_spare_bind(t, sid[b & 1], (b & 4) ? "B" : "A", &q, now, &r) == 0) {
                memcpy(rid[k], r.reservation_id, sizeof rid[k]);
                wslot[k] = (int)(r.offset / UNIT);
                P.writing[wslot[k]] = true;
            }
            break;
        }
        default: now += b; break;
        }
        check(rsv_check(t) == 0);
        rsv_stats s;
        rsv_get_stats(t, &s);
        check(s.bytes_held + s.spare_bytes == P.used);
    }
    /* settle: every writer stops and abandons, every lease is released */
    for (unsigned k = 0; k < NIDS; k++) {
        char tid[4] = {'t', (char)('0' + k), 0};
        if (wslot[k] >= 0) P.writing[wslot[k]] = false;
        bool c;
        (void)rsv_cancel(t, tid, NULL, true, false, now, &c);
    }
    for (int h = 0; h < 4; h++) {
        char hash[4] = {'h', (char)('0' + h), 0};
        while (rsv_release(t, hash, now) == 0) {
        }
    }
    rsv_reap(t, now + 1000);
    rsv_evict_resident(t, SIZE_MAX);
    rsv_spare_free_all(t);
    check(rsv_check(t) == 0);
    check(P.used == 0);
    rsv_close(t);
    return 0;
}
