/*
 * fuzz_pull_router — feeds one ROUTER request frame to the pull producer's
 * request handler (pull_router_handle), with a real pool holding three
 * resident items (which are its inventory), and no sockets.
 *
 * Input: byte 0 chooses how dispatch behaves (bit 0: refuse with ECT_EBUSY)
 * and the page size (bits 1..3: 1..8 items per ECTransferReady); the rest
 * is the frame.
 *
 * Invariants beyond "no crash, no leak, no sanitizer report":
 *  - every reply decodes as ECTransferComplete or ECTransferReady;
 *  - a Ready series answers with the request's id, ends with more = false,
 *    and lists only items the producer holds;
 *  - no lease outlives the call (dispatch here finishes the job at once);
 *  - a refused or failed pull is answered exactly once, a dispatched one
 *    never by the handler;
 *  - the pulls of an ECTransferPullBatch that dispatch answers as written
 *    (pull_router_answer) are told in ECTransferDone messages, each token
 *    once, and nothing is held after pull_router_flush_done.
 * Bit 5 of byte 0 makes the completions carry ect_batch.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pull/pull_internal.h"
#include "util/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ect_pool *pool;
static const char *held[3] = {"abc", "img-0", "video"};

typedef struct state {
    pull_router *r;
    int refuse;
    int completes, readies, dispatched, batched, done_tokens;
    bool ready_open; /* a Ready with more = true was the last one */
} state;

static int reply(void *user, const pull_peer *peer, const void *msg, size_t len) {
    state *s = user;
    (void)peer;
    wire_pull_msg m;
    if (wire_pull_decode_any(msg, len, &m) != 0) abort();
    if (m.type == WIRE_PULL_COMPLETE) {
        if (m.u.complete.status == 0) abort(); /* the handler only refuses */
        s->completes++;
    } else if (m.type == WIRE_PULL_DONE) {
        s->done_tokens += (int)m.u.done.n;
    } else if (m.type == WIRE_PULL_READY) {
        s->readies++;
        s->ready_open = m.u.ready.more;
        for (size_t i = 0; i < m.u.ready.n_items; i++) {
            bool known = false;
            for (int k = 0; k < 3; k++) known |= strcmp(m.u.ready.items[i].mm_hash, held[k]) == 0;
            if (!known) abort();
        }
    } else {
        abort();
    }
    wire_pull_msg_free(&m);
    return 0;
}

static int dispatch(void *user, pull_job *j) {
    state *s = user;
    if (s->refuse) return ect_set_error(ECT_EBUSY, "fuzz: lanes busy");
    if (ect_pool_release(pool, j->mm_hash) != 0) abort();
    s->dispatched++;
    if (j->batched) { /* written: told in the peer's next ECTransferDone */
        if (!j->has_token) abort();
        s->batched++;
        pull_router_answer(s->r, &j->peer, j->mm_hash, 0, true, j->token, true, NULL);
    }
    pull_job_free(j);
    return 0;
}

static void setup(void) {
    ect_pool_opts o;
    ect_pool_opts_init(&o);
    o.capacity = 1 << 20;
    o.alignment = 64;
    if (ect_pool_open(&o, &pool) != 0) abort();
    for (int k = 0; k < 3; k++) {
        uint64_t off, shape[2] = {4, (uint64_t)k + 1};
        if (ect_pool_alloc(pool, 8 * ((uint64_t)k + 1), &off) != 0) abort();
        if (ect_pool_put(pool, held[k], off, 8 * ((uint64_t)k + 1), shape, 2, "bfloat16", 0) != 0)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!pool) setup();
    if (size < 1) return 0;
    state s = {.refuse = data[0] & 1};
    pull_router r = {.pool = pool,
                     .session_id = "fuzz-session",
                     .page_items = 1 + ((data[0] >> 1) & 7),
                     .allow = (data[0] & 16) ? NULL : "*", /* both connect policies */
                     .batch_max = (data[0] & 32) ? WIRE_PULL_MAX_ITEMS : 0,
                     .ops = {.user = &s, .reply = reply, .dispatch = dispatch}};
    s.r = &r;
    pull_peer peer = {.id = {0, 1, 2, 3}, .id_len = 4, .addr = "127.0.0.1"};
    pull_router_handle(&r, &peer, data + 1, size - 1);
    pull_router_flush_done(&r);
    if (s.done_tokens != s.batched) abort();
    pull_router_fini(&r);
    if (r.st.frames != 1) abort();
    if (s.ready_open) abort();
    if (r.st.requests && s.readies == 0) abort();
    if ((uint64_t)s.completes != r.st.pulls_refused) abort();
    if ((uint64_t)s.dispatched + r.st.pulls_refused < r.st.pulls) abort();
    ect_pool_stat st;
    ect_pool_stats(pool, &st);
    if (st.leased != 0 || st.residents != 3) abort();
    return 0;
}
