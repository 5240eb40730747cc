/*
 * pull_msg — msgpack codecs of the generation-1 (pull) messages. Pure: no
 * sockets, no threads; every function is thread-compatible.
 *
 * Each message is a msgpack map keyed by the exact upstream field names, keys
 * in field order (how msgspec encodes a Struct), so a msgspec peer reads and
 * writes them unchanged. docs/PROTOCOL.md ("pull") gives every field, bound
 * and byte-exact example.
 *
 * Decoding is strict. A decoder returns 0, ECT_EPROTO for any malformed or
 * out-of-bound input (ect_last_error() names the message and field, e.g.
 * "ECTransferPull.dst_ptr: negative int -1, expected 0..2^64-1"), ECT_ENOMEM,
 * or ECT_EINVAL for a NULL buffer with len > 0. It reads only buf[0..len),
 * never more than WIRE_PULL_MAX_MSG bytes, and allocates O(len). On failure
 * *out is zeroed and owns nothing. On success the caller owns *out and
 * releases it with the matching _free. Unknown extra keys are ignored.
 *
 * Encoders check the same bounds (ECT_EINVAL naming the field), so nothing
 * they produce is refused by a decoder. On success *out is a malloc'd buffer
 * the caller owns and frees with free(); on failure *out is NULL.
 *
 * ectransfer's extension keys (docs/PROTOCOL.md "Extension keys") are
 * optional fields of ECTransferPull (dst_key, token) and ECTransferComplete
 * (token, error): encoded after the upstream fields when present (the map's
 * count grows; msgspec peers ignore unknown keys), decoded when present. A
 * present extension key that is malformed does not fail the decode, because
 * the upstream fields still name what to answer: the message decodes with its
 * extension fields absent and ext_error set to why.
 */
#ifndef ECT_WIRE_PULL_MSG_H
#define ECT_WIRE_PULL_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/dtype.h"

/* Bounds (docs/PROTOCOL.md). Every message within them encodes to less than
 * WIRE_PULL_MAX_MSG bytes: a full ECTransferReady (4096 items, every string
 * and shape at its bound) takes 1,421,923. */
#define WIRE_PULL_MAX_MSG (2u * 1024 * 1024) /* bytes in one encoded message */
#define WIRE_PULL_MAX_STR 256                /* mm_hash, session and request ids */
#define WIRE_PULL_MAX_ITEMS 4096             /* entries of every list */
#define WIRE_PULL_MAX_DEPTH 16               /* msgpack nesting, the top map is 1 */
#define WIRE_PULL_MAX_KEYS 64                /* keys of the top-level map */
#define WIRE_PULL_MAX_OBJECTS 131072         /* msgpack objects in one message */
#define WIRE_PULL_DTYPE_CAP 32               /* storage of a dtype name, NUL included */
#define WIRE_PULL_MAX_KEY 2047               /* the dst_key extension (ECT_XPORT_KEY_MAX - 1) */

/* One announced tensor: a row of the columnar lists of ECHashNotification
 * and ECTransferReady (the C side keeps rows so lengths cannot disagree). */
typedef struct wire_pull_item {
    char *mm_hash; /* owned, 1..256 bytes of UTF-8 */
    uint32_t ndim; /* 0..WIRE_MAX_NDIM */
    uint64_t shape[WIRE_MAX_NDIM];
    char dtype[WIRE_PULL_DTYPE_CAP]; /* as sent: "bfloat16" or "torch.bfloat16" */
    uint64_t num_bytes;              /* == product(shape) x element size */
} wire_pull_item;

/* ECHashNotification — producer PUB -> consumer SUB. */
typedef struct wire_hash_notification {
    wire_pull_item *items; /* owned array of n_items */
    size_t n_items;        /* 0..WIRE_PULL_MAX_ITEMS */
    char *producer_session_id;
} wire_hash_notification;

/* ECTransferPull — consumer DEALER -> producer ROUTER: write mm_hash into the
 * consumer's registered buffer at dst_ptr + dst_offset. */
typedef struct wire_transfer_pull {
    char *mm_hash;
    uint64_t dst_ptr;
    uint64_t dst_offset;
    char *consumer_session_id;
    /* extensions: */
    char *dst_key;   /* the destination region's key, 1..WIRE_PULL_MAX_KEY bytes; NULL: absent */
    bool has_token;  /* `token` present */
    uint64_t token;  /* chosen by the consumer, echoed in the completion */
    char *ext_error; /* decode only: why a present extension key was refused, else NULL */
} wire_transfer_pull;

/* ECTransferComplete — producer ROUTER -> consumer DEALER; status 0 is
 * success, anything else (an ECT_E* code from this implementation) failure. */
typedef struct wire_transfer_complete {
    char *mm_hash;
    int32_t status;
    /* extensions: */
    bool has_token; /* `token` present: the pull's, echoed */
    uint64_t token;
    char *error;        /* why, when status != 0; NULL or "": absent. The encoder cuts it to
                           WIRE_PULL_MAX_STR bytes at a UTF-8 boundary */
    uint64_t shm_id;    /* `ect_shm_id`: the producer's shm offer id (docs/PROTOCOL.md "shm",
                           "Offers"), 16 lowercase hex digits on the wire; 0: absent */
    uint32_t batch_max; /* `ect_batch`: the producer takes ECTransferPullBatch of up to this many
                           pulls (2..WIRE_PULL_MAX_ITEMS); 0: absent */
    char *ext_error;    /* decode only: why a present extension key was refused, else NULL */
} wire_transfer_complete;

/* ECTransferPullBatch (ectransfer only, docs/PROTOCOL.md "Batched pulls") —
 * consumer -> producer, sent only to a producer whose completions carried
 * `ect_batch`: n pulls in one message. Every entry is a whole pull (dst_key
 * and token required); they share dst_ptr and consumer_session_id on the
 * wire, so the encoder refuses entries that differ in them. Decoded entries
 * own their strings (each its own copy of the session), ext_error unused. */
typedef struct wire_transfer_pull_batch {
    wire_transfer_pull *pulls; /* owned array of n (encode: borrowed) */
    size_t n;                  /* 1..WIRE_PULL_MAX_ITEMS */
} wire_transfer_pull_batch;

/* ECTransferDone (ectransfer only) — producer -> consumer: the pulls of an
 * ECTransferPullBatch with these tokens were written (status 0). A pull that
 * failed is answered by its own ECTransferComplete. */
typedef struct wire_transfer_done {
    uint64_t *tokens; /* owned array of n */
    size_t n;         /* 1..WIRE_PULL_MAX_ITEMS */
} wire_transfer_done;

/* ECTransferRequest — a (late-joining) consumer DEALER -> producer ROUTER:
 * "what do you hold?". An empty mm_hashes filter asks for everything. */
typedef struct wire_transfer_request {
    char *request_id; /* chosen by the consumer, echoed in every reply */
    char *consumer_session_id;
    char **mm_hashes; /* owned array of n_mm_hashes owned strings */
    size_t n_mm_hashes;
} wire_transfer_request;

/* ECTransferReady — producer ROUTER -> consumer DEALER, the answer to one
 * ECTransferRequest: one or more messages with its request_id, every one but
 * the last with more = true. */
typedef struct wire_transfer_ready {
    char *request_id;
    wire_pull_item *items;
    size_t n_items;
    char *producer_session_id;
    bool more;
} wire_transfer_ready;

typedef enum wire_pull_type {
    WIRE_PULL_NONE = 0,
    WIRE_PULL_NOTIFICATION,
    WIRE_PULL_PULL,
    WIRE_PULL_COMPLETE,
    WIRE_PULL_REQUEST,
    WIRE_PULL_READY,
    WIRE_PULL_PULL_BATCH, /* ectransfer only */
    WIRE_PULL_DONE,       /* ectransfer only */
} wire_pull_type;

/* Any one pull message, as told apart by wire_pull_decode_any. */
typedef struct wire_pull_msg {
    wire_pull_type type;
    union {
        wire_hash_notification notification;
        wire_transfer_pull pull;
        wire_transfer_complete complete;
        wire_transfer_request request;
        wire_transfer_ready ready;
        wire_transfer_pull_batch batch;
        wire_transfer_done done;
    } u;
} wire_pull_msg;

/* Upstream name of a type ("ECTransferPull"); "unknown" for others. */
const char *wire_pull_type_name(wire_pull_type t);

int wire_hash_notification_encode(const wire_hash_notification *m, void **out, size_t *out_len);
int wire_hash_notification_decode(const void *buf, size_t len, wire_hash_notification *out);
void wire_hash_notification_free(wire_hash_notification *m);

int wire_transfer_pull_encode(const wire_transfer_pull *m, void **out, size_t *out_len);
int wire_transfer_pull_decode(const void *buf, size_t len, wire_transfer_pull *out);
void wire_transfer_pull_free(wire_transfer_pull *m);

int wire_transfer_complete_encode(const wire_transfer_complete *m, void **out, size_t *out_len);
int wire_transfer_complete_decode(const void *buf, size_t len, wire_transfer_complete *out);
void wire_transfer_complete_free(wire_transfer_complete *m);

int wire_transfer_request_encode(const wire_transfer_request *m, void **out, size_t *out_len);
int wire_transfer_request_decode(const void *buf, size_t len, wire_transfer_request *out);
void wire_transfer_request_free(wire_transfer_request *m);

int wire_transfer_ready_encode(const wire_transfer_ready *m, void **out, size_t *out_len);
int wire_transfer_ready_decode(const void *buf, size_t len, wire_transfer_ready *out);
void wire_transfer_ready_free(wire_transfer_ready *m);

int wire_transfer_pull_batch_encode(const wire_transfer_pull_batch *m, void **out, size_t *out_len);
int wire_transfer_pull_batch_decode(const void *buf, size_t len, wire_transfer_pull_batch *out);
void wire_transfer_pull_batch_free(wire_transfer_pull_batch *m);

int wire_transfer_done_encode(const wire_transfer_done *m, void **out, size_t *out_len);
int wire_transfer_done_decode(const void *buf, size_t len, wire_transfer_done *out);
void wire_transfer_done_free(wire_transfer_done *m);

/* Decodes whichever pull message `buf` holds, told apart by its keys (msgspec
 * peers send untagged maps), checked in this order:
 *   "ect_pulls" -> ECTransferPullBatch;  "ect_done" -> ECTransferDone (ours);
 *   "dst_ptr" -> ECTransferPull;  "status" -> ECTransferComplete;
 *   "request_id" with "producer_session_id" -> ECTransferReady;
 *   "request_id" -> ECTransferRequest;  "producer_session_id" -> ECHashNotification;
 *   none of them -> ECT_EPROTO "unknown message type".
 * The chosen type is then decoded strictly, so a missing field is named. */
int wire_pull_decode_any(const void *buf, size_t len, wire_pull_msg *out);
/* The same through the general decoder alone. wire_pull_decode_any and the
 * pull / complete decoders first try a one-pass path for the usual shape of
 * ECTransferPull and ECTransferComplete and fall back to this for anything
 * else; both give the same result (test_wire_pull, fuzz_pull_msg). */
int wire_pull_decode_general(const void *buf, size_t len, wire_pull_msg *out);
/* Encodes m->u according to m->type. */
int wire_pull_msg_encode(const wire_pull_msg *m, void **out, size_t *out_len);
/* Frees m->u according to m->type and zeroes *m; accepts NULL. */
void wire_pull_msg_free(wire_pull_msg *m);

#endif
