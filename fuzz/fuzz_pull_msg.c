/*
 * fuzz_pull_msg — feeds arbitrary bytes to every generation-1 decoder.
 *
 * Invariants checked beyond "no crash, no leak, no sanitizer report":
 *  - every failure is ECT_EPROTO (ECT_ENOMEM cannot happen within the
 *    fuzzer's memory limit) with a non-empty error text, and never the
 *    "msgpack-c could not parse" fallback (the raw scan and msgpack-c agree);
 *  - whatever decodes re-encodes, and that encoding decodes to a message that
 *    encodes to the same bytes (the round trip is a fixed point);
 *  - when wire_pull_decode_any picks a type, that type's own decoder accepts
 *    the same bytes;
 *  - a pull or completion whose extension keys were refused (ext_error set)
 *    carries none of them, and its error text is non-empty;
 *  - wire_pull_decode_any (with its one-pass path for ECTransferPull,
 *    ECTransferComplete, ECTransferPullBatch and ECTransferDone) and
 *    wire_pull_decode_general agree: the same result code, type, fields and
 *    ext_error.
 * Seeds in fuzz/corpus/pull_msg/ are written by the unit test:
 *   ECT_PULL_SEED_DIR=fuzz/corpus/pull_msg build/tests/test_wire_pull
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "wire/pull_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_failure(int rc) {
    if (rc != ECT_EPROTO || ect_last_error()[0] == '\0') abort();
    /* The raw scan must accept exactly what msgpack-c parses. That fallback
     * text is "<message>: msgpack-c could not parse ..."; texts that quote a
     * peer's key read "<message>.<key>: ...", so a key cannot fake it. */
    const char *e = ect_last_error(), *colon = strchr(e, ':');
    static const char fallback[] = ": msgpack-c could not parse";
    if (colon && !memchr(e, '.', (size_t)(colon - e)) &&
        strncmp(colon, fallback, sizeof fallback - 1) == 0)
        abort();
}

static void check_extensions(const wire_pull_msg *m) {
    const char *why = NULL;
    if (m->type == WIRE_PULL_PULL) {
        why = m->u.pull.ext_error;
        if (why && (m->u.pull.dst_key || m->u.pull.has_token)) abort();
    } else if (m->type == WIRE_PULL_COMPLETE) {
        why = m->u.complete.ext_error;
        if (why && (m->u.complete.error || m->u.complete.has_token || m->u.complete.shm_id ||
                    m->u.complete.batch_max))
            abort();
    }
    if (why && !why[0]) abort();
}

/* Encodes m, decodes that, encodes again: both encodings must be equal. */
static void check_round_trip(const wire_pull_msg *m) {
    check_extensions(m);
    void *e1 = NULL, *e2 = NULL;
    size_t l1 = 0, l2 = 0;
    if (wire_pull_msg_encode(m, &e1, &l1) != 0) abort();
    wire_pull_msg again;
    if (wire_pull_decode_any(e1, l1, &again) != 0 || again.type != m->type) abort();
    if (wire_pull_msg_encode(&again, &e2, &l2) != 0) abort();
    if (l1 != l2 || memcmp(e1, e2, l1) != 0) abort();
    free(e1);
    free(e2);
    wire_pull_msg_free(&again);
}

static bool same_str(const char *a, const char *b) {
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* decode_any's result is the general decoder's. */
static void check_general(const uint8_t *data, size_t size, int rc, const wire_pull_msg *m) {
    wire_pull_msg g;
    int grc = wire_pull_decode_general(data, size, &g);
    if (grc != rc) abort();
    if (rc) return;
    if (g.type != m->type) abort();
    if (m->type == WIRE_PULL_PULL) {
        const wire_transfer_pull *a = &m->u.pull, *b = &g.u.pull;
        if (!same_str(a->mm_hash, b->mm_hash) || a->dst_ptr != b->dst_ptr ||
            a->dst_offset != b->dst_offset ||
            !same_str(a->consumer_session_id, b->consumer_session_id) ||
            !same_str(a->dst_key, b->dst_key) || a->has_token != b->has_token ||
            a->token != b->token || !same_str(a->ext_error, b->ext_error))
            abort();
    } else if (m->type == WIRE_PULL_COMPLETE) {
        const wire_transfer_complete *a = &m->u.complete, *b = &g.u.complete;
        if (!same_str(a->mm_hash, b->mm_hash) || a->status != b->status ||
            a->has_token != b->has_token || a->token != b->token || !same_str(a->error, b->error) ||
            a->shm_id != b->shm_id || a->batch_max != b->batch_max ||
            !same_str(a->ext_error, b->ext_error))
            abort();
    } else if (m->type == WIRE_PULL_PULL_BATCH) {
        const wire_transfer_pull_batch *a = &m->u.batch, *b = &g.u.batch;
        if (a->n != b->n) abort();
        for (size_t i = 0; i < a->n; i++) {
            const wire_transfer_pull *x = &a->pulls[i], *y = &b->pulls[i];
            if (!same_str(x->mm_hash, y->mm_hash) || x->dst_ptr != y->dst_ptr ||
                x->dst_offset != y->dst_offset ||
                !same_str(x->consumer_session_id, y->consumer_session_id) ||
                !same_str(x->dst_key, y->dst_key) || !x->has_token || !y->has_token ||
                x->token != y->token || x->ext_error || y->ext_error)
                abort();
        }
    } else if (m->type == WIRE_PULL_DONE) {
        const wire_transfer_done *a = &m->u.done, *b = &g.u.done;
        if (a->n != b->n || memcmp(a->tokens, b->tokens, a->n * sizeof *a->tokens) != 0) abort();
    }
    wire_pull_msg_free(&g);
}

/* Runs one typed decoder; on success wraps the result as a wire_pull_msg for
 * the round trip (which goes through decode_any, so the key rule must also
 * classify it as this type). */
#define TYPED(decode, field, tag)                                                                  \
    do {                                                                                           \
        wire_pull_msg m = {.type = tag};                                                           \
        int trc = decode(data, size, &m.u.field);                                                  \
        if (trc)                                                                                   \
            check_failure(trc);                                                                    \
        else {                                                                                     \
            ok_typed[tag] = 1;                                                                     \
            check_round_trip(&m);                                                                  \
            wire_pull_msg_free(&m);                                                                \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int ok_typed[WIRE_PULL_DONE + 1] = {0};
    wire_pull_msg any;
    int rc = wire_pull_decode_any(data, size, &any);
    check_general(data, size, rc, &any);
    if (rc)
        check_failure(rc);
    else
        check_round_trip(&any);

    TYPED(wire_hash_notification_decode, notification, WIRE_PULL_NOTIFICATION);
    TYPED(wire_transfer_pull_decode, pull, WIRE_PULL_PULL);
    TYPED(wire_transfer_complete_decode, complete, WIRE_PULL_COMPLETE);
    TYPED(wire_transfer_request_decode, request, WIRE_PULL_REQUEST);
    TYPED(wire_transfer_ready_decode, ready, WIRE_PULL_READY);
    TYPED(wire_transfer_pull_batch_decode, batch, WIRE_PULL_PULL_BATCH);
    TYPED(wire_transfer_done_decode, done, WIRE_PULL_DONE);

    if (!rc && !ok_typed[any.type]) abort();
    wire_pull_msg_free(&any);
    return 0;
}
