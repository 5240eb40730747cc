/*
 * fuzz_control_msg — feeds arbitrary bytes to every push control decoder
 * (the request dispatcher, the reply decoder for each op, the event decoder).
 * Whatever decodes must re-encode, the encoding must decode again, and
 * encoding that must give the same bytes (encode . decode is idempotent).
 * The fast path (control_fast.c) is checked against the jansson path: both
 * decoders give the same return code and, on success, structs that encode to
 * the same bytes; both encoders give the same bytes.
 * Seeds: fuzz/corpus/control_msg/ (one valid frame of each type).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "wire/control_msg.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond,           \
                    ect_last_error());                                                             \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Encodes with the fast path off (the jansson reference) into *out. */
static int slow_encode_request(const wire_ctl_request *q, char **out) {
    wctl_fast_off = true;
    int rc = wire_ctl_encode_request(q, out);
    wctl_fast_off = false;
    return rc;
}

static int slow_encode_reply(const wire_ctl_reply *r, char **out) {
    wctl_fast_off = true;
    int rc = wire_ctl_encode_reply(r, out);
    wctl_fast_off = false;
    return rc;
}

/* Both decoders agree on the frame, and so does the fast one decoding into
 * memory kept from the frames before (the shard's way); the encoders agree
 * on what each decoded to. */
static wire_ctl_keep kept;

static void diff_request(const uint8_t *data, size_t size) {
    wire_ctl_request f, s, k;
    int rf = wire_ctl_decode_request(data, size, &f);
    int rk = wire_ctl_decode_request_kept(data, size, &k, &kept);
    wctl_fast_off = true;
    int rs = wire_ctl_decode_request(data, size, &s);
    wctl_fast_off = false;
    CHECK(rf == rs && rf == rk);
    if (rf == 0) {
        char *a = NULL, *b = NULL, *c = NULL, *d = NULL;
        int ea = slow_encode_request(&f, &a), eb = slow_encode_request(&s, &b);
        int ec = wire_ctl_encode_request(&s, &c), ed = slow_encode_request(&k, &d);
        CHECK(ea == eb && eb == ec && ec == ed);
        if (ea == 0) CHECK(strcmp(a, b) == 0 && strcmp(b, c) == 0 && strcmp(c, d) == 0);
        free(a);
        free(b);
        free(c);
        free(d);
        wire_ctl_request_clear(&f);
        wire_ctl_request_clear(&s);
        wire_ctl_request_clear_kept(&k, &kept);
    }
}

static void diff_reply(wire_ctl_op op, size_t expect, const uint8_t *data, size_t size) {
    wire_ctl_reply f, s;
    int rf = wire_ctl_decode_reply(op, expect, data, size, &f);
    wctl_fast_off = true;
    int rs = wire_ctl_decode_reply(op, expect, data, size, &s);
    wctl_fast_off = false;
    CHECK(rf == rs);
    if (rf == 0) {
        char *a = NULL, *b = NULL, *c = NULL;
        int ea = slow_encode_reply(&f, &a), eb = slow_encode_reply(&s, &b);
        int ec = wire_ctl_encode_reply(&s, &c);
        CHECK(ea == eb && eb == ec);
        if (ea == 0) CHECK(strcmp(a, b) == 0 && strcmp(b, c) == 0);
        free(a);
        free(b);
        free(c);
        wire_ctl_reply_clear(&f);
        wire_ctl_reply_clear(&s);
    }
}

static void fuzz_request(const uint8_t *data, size_t size) {
    diff_request(data, size);
    wire_ctl_request q;
    int rc = wire_ctl_decode_request(data, size, &q);
    if (rc) {
        /* The server's reply to a bad frame must always be encodable. */
        char *reply = NULL;
        CHECK(wire_ctl_encode_decode_failure(rc, &reply) == 0);
        free(reply);
        return;
    }
    char *a = NULL, *b = NULL;
    bool failed_item = false;
    for (size_t i = 0; q.op == WIRE_OP_RESERVE_BATCH && i < q.u.reserve_batch.n; i++)
        failed_item |= q.u.reserve_batch.items[i].rc != 0;
    if (failed_item) {
        /* Served item by item, but never sent on: the encoder refuses it. */
        CHECK(wire_ctl_encode_request(&q, &a) == ECT_EINVAL && a == NULL);
        wire_ctl_request_clear(&q);
        return;
    }
    CHECK(wire_ctl_encode_request(&q, &a) == 0);
    wire_ctl_request_clear(&q);
    CHECK(wire_ctl_decode_request(a, strlen(a), &q) == 0);
    CHECK(wire_ctl_encode_request(&q, &b) == 0);
    CHECK(strcmp(a, b) == 0);
    wire_ctl_request_clear(&q);
    free(a);
    free(b);
}

static void fuzz_reply(wire_ctl_op op, const uint8_t *data, size_t size) {
    diff_reply(op, SIZE_MAX, data, size);
    if (op == WIRE_OP_RESERVE_BATCH || op == WIRE_OP_COMPLETE_BATCH || op == WIRE_OP_ECT_READY)
        diff_reply(op, size % 5, data, size); /* the item count check, both paths */
    wire_ctl_reply r;
    if (wire_ctl_decode_reply(op, SIZE_MAX, data, size, &r)) return;
    char *a = NULL, *b = NULL;
    CHECK(wire_ctl_encode_reply(&r, &a) == 0);
    size_t n = r.op == WIRE_OP_RESERVE_BATCH    ? r.u.reserve_batch.n
               : r.op == WIRE_OP_COMPLETE_BATCH ? r.u.complete_batch.n
                                                : SIZE_MAX;
    if (!r.ok) n = SIZE_MAX;
    wire_ctl_reply_clear(&r);
    CHECK(wire_ctl_decode_reply(op, n, a, strlen(a), &r) == 0);
    CHECK(wire_ctl_encode_reply(&r, &b) == 0);
    CHECK(strcmp(a, b) == 0);
    wire_ctl_reply_clear(&r);
    free(a);
    free(b);
}

/* Both event decoders agree on the frame (return code, and on success the
 * same struct, field by field). */
static void diff_event(const uint8_t *data, size_t size) {
    wire_event f, s;
    int rf = wire_ctl_decode_event(data, size, &f);
    wctl_fast_off = true;
    int rs = wire_ctl_decode_event(data, size, &s);
    wctl_fast_off = false;
    CHECK(rf == rs);
    if (rf == 0) {
        CHECK(strcmp(f.transfer_id, s.transfer_id) == 0 && strcmp(f.mm_hash, s.mm_hash) == 0 &&
              strcmp(f.reservation_id, s.reservation_id) == 0 && f.ready == s.ready &&
              f.shard == s.shard && (f.error == NULL) == (s.error == NULL) &&
              (!f.error || strcmp(f.error, s.error) == 0) && f.tensor.nbytes == s.tensor.nbytes &&
              f.tensor.ndim == s.tensor.ndim &&
              memcmp(f.tensor.shape, s.tensor.shape, sizeof f.tensor.shape) == 0 &&
              strcmp(f.tensor.dtype, s.tensor.dtype) == 0);
        wire_event_clear(&f);
        wire_event_clear(&s);
    }
}

static void fuzz_event(const uint8_t *data, size_t size) {
    diff_event(data, size);
    wire_event e;
    if (wire_ctl_decode_event(data, size, &e)) return;
    char *a = NULL, *b = NULL, *slow = NULL;
    CHECK(wire_ctl_encode_event(&e, &a) == 0);
    wctl_fast_off = true; /* the fast event encoder writes jansson's bytes */
    CHECK(wire_ctl_encode_event(&e, &slow) == 0);
    wctl_fast_off = false;
    CHECK(strcmp(a, slow) == 0);
    free(slow);
    wire_event_clear(&e);
    CHECK(wire_ctl_decode_event(a, strlen(a), &e) == 0);
    CHECK(wire_ctl_encode_event(&e, &b) == 0);
    CHECK(strcmp(a, b) == 0);
    wire_event_clear(&e);
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_request(data, size);
    for (int op = WIRE_OP_RESERVE; op <= WIRE_OP_LAST; op++)
        fuzz_reply((wire_ctl_op)op, data, size);
    fuzz_event(data, size);
    return 0;
}
