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
 *    carries none of them, and its error text is non-empty.
 * Seeds in fuzz/corpus/pull_msg/ are written by the unit test:
 *   ECT_PULL_SEED_DIR=fuzz/corpus/pull_msg build/tests/test_wire_pull
 */
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
        if (why && (m->u.complete.error || m->u.complete.has_token)) abort();
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
    int ok_typed[WIRE_PULL_READY + 1] = {0};
    wire_pull_msg any;
    int rc = wire_pull_decode_any(data, size, &any);
    if (rc)
        check_failure(rc);
    else
        check_round_trip(&any);

    TYPED(wire_hash_notification_decode, notification, WIRE_PULL_NOTIFICATION);
    TYPED(wire_transfer_pull_decode, pull, WIRE_PULL_PULL);
    TYPED(wire_transfer_complete_decode, complete, WIRE_PULL_COMPLETE);
    TYPED(wire_transfer_request_decode, request, WIRE_PULL_REQUEST);
    TYPED(wire_transfer_ready_decode, ready, WIRE_PULL_READY);

    if (!rc && !ok_typed[any.type]) abort();
    wire_pull_msg_free(&any);
    return 0;
}
