/*
 * control_msg — the JSON control messages of the push protocol (generation 2):
 * every request a producer or scheduler sends to a consumer shard's REP
 * socket, every result in the reply envelope, and the readiness / abandoned
 * events a shard pushes to its scheduler. Pure: no sockets, no threads.
 *
 * Encoding: compact JSON (no spaces), keys in the fixed order docs/PROTOCOL.md
 * lists, returned as a NUL-terminated string. "Caller owns the result" and
 * frees it with free().
 *
 * Decoding is strict: a value of the wrong JSON type, a missing required key,
 * a negative or out-of-range integer, a real where an integer is required, a
 * string or list over its bound, duplicate keys, trailing bytes, NUL bytes,
 * frames over WIRE_CTL_MAX_FRAME and nesting deeper than WIRE_CTL_MAX_DEPTH
 * are all refused with an ect_last_error() text that names the field, e.g.
 * "items[3].shape[1]: expected a non-negative integer, got real". Unknown
 * extra keys are ignored. Decoding never aborts and never leaks.
 *
 * Return codes of every decoder:
 *   ECT_EPROTO    the bytes are not a JSON object within the frame bounds
 *                 (a server answers WIRE_CTL_MALFORMED);
 *   ECT_ENOTSUP   (requests only) unknown or missing op; the text is exactly
 *                 "unknown control op: 'x'" as upstream words it;
 *   ECT_EINVAL    a field is wrong; the text names it;
 *   ECT_EOVERFLOW shape x dtype size overflows 64 bits;
 *   ECT_ENOMEM    out of memory (jansson reports a few of its own allocation
 *                 failures as a syntax error, so those come back ECT_EPROTO).
 * Encoders return ECT_EINVAL for whatever a decoder would refuse (ECT_ERANGE
 * for an integer above 2^63-1) and ECT_ENOMEM; error texts are never refused
 * but cut to WIRE_ERROR_MAX bytes with invalid UTF-8 bytes shown as '?', so a
 * server can always send its reply.
 * On any failure the output struct is left cleared (safe to _clear again).
 *
 * Ownership: a struct filled by a decoder owns its heap strings (error texts,
 * dst_key) and arrays (batch items, ports); release them with the matching
 * _clear function, which also accepts a zeroed struct. Structs a caller fills
 * for an encoder may point at any memory; encoders only read them.
 *
 * Thread-safety: every function is reentrant; none keeps state.
 */
#ifndef ECT_WIRE_CONTROL_MSG_H
#define ECT_WIRE_CONTROL_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/dtype.h"

/* ---- bounds (bytes of UTF-8, after JSON unescaping) */
#define WIRE_CTL_MAX_FRAME (16u << 20) /* whole frame: 4096 items of 256-byte ids fit */
#define WIRE_CTL_MAX_DEPTH 32          /* nesting of arrays and objects */
#define WIRE_ID_MAX 256                /* transfer_id, mm_hash, reservation_id */
#define WIRE_SESSION_MAX 256           /* dst_session ("host:port") */
#define WIRE_DTYPE_MAX 64              /* dtype string */
#define WIRE_TRANSPORT_MAX 32          /* transport name */
#define WIRE_KEY_MAX 4096              /* dst_key */
#define WIRE_SECRET_MAX 64             /* event_secret (extension of the event_port reply) */
#define WIRE_ERROR_MAX 4096            /* error texts */
#define WIRE_BATCH_MAX 4096            /* items of a batch request or result */
#define WIRE_PEERS_MAX 4096            /* ports of a peers result */
#define WIRE_ITEM_ERROR_MAX 255        /* text kept for a reserve_batch item that failed */
#define WIRE_REASON_MAX 255            /* a cancelled reserve result's reason */
#define WIRE_READY_DEFAULT 256         /* ect_ready items listed when "max" is absent */

/* The canned reply texts a control server uses (SPEC, exact). */
#define WIRE_CTL_MALFORMED "malformed control request"

typedef enum wire_ctl_op {
    WIRE_OP_RESERVE = 1,
    WIRE_OP_RESERVE_BATCH,
    WIRE_OP_STATUS,
    WIRE_OP_EVENT_PORT,
    WIRE_OP_PEERS,
    WIRE_OP_COMPLETE,
    WIRE_OP_COMPLETE_BATCH,
    WIRE_OP_CANCEL,
    /* extension (docs/PROTOCOL.md): a shard's status for operators; an
     * upstream consumer answers it "unknown control op: 'ect_status'" */
    WIRE_OP_ECT_STATUS,
    /* extension (docs/PROTOCOL.md "a spare range granted ahead"): bind a
     * spare our shard granted to an item written into it, and complete it */
    WIRE_OP_ECT_PUT,
    /* extension (docs/PROTOCOL.md "Lost events: the scheduler lists what is
     * ready"): the items ready on a shard, for its own (trusted) scheduler */
    WIRE_OP_ECT_READY,
} wire_ctl_op;
#define WIRE_OP_LAST WIRE_OP_ECT_READY

/* The wire name of an op ("reserve", ...), or NULL for a value outside the enum. */
const char *wire_ctl_op_name(wire_ctl_op op);

/* A tensor's size, shape and dtype; always nbytes == product(shape) x size(dtype)
 * after decoding. The codec keeps dtype as written ("torch.bfloat16" stays
 * so); a consumer shard canonicalises it ("bfloat16") before it stores or
 * reports it (docs/PROTOCOL.md, "One dtype form on the push side"). */
typedef struct wire_tensor {
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[WIRE_MAX_NDIM];
    char dtype[WIRE_DTYPE_MAX + 1];
} wire_tensor;

/* ------------------------------------------------------------- requests */

/* reserve, and one item of reserve_batch. transfer_id and mm_hash are non-empty. */
typedef struct wire_reserve_req {
    char transfer_id[WIRE_ID_MAX + 1];
    char mm_hash[WIRE_ID_MAX + 1];
    wire_tensor tensor;
} wire_reserve_req;

/* One item of a decoded reserve_batch. Upstream answers every item on its own
 * ("one failure does not fail the others"), so an item that does not decode
 * does not fail the frame: rc is its ECT_E* code and error the text its
 * {"ok": false, "error": ...} reply carries ("items[3].dtype: ..."). */
typedef struct wire_reserve_item {
    int rc;
    char error[WIRE_ITEM_ERROR_MAX + 1];
    wire_reserve_req req; /* valid when rc == 0 */
} wire_reserve_item;

/* complete, and one item of complete_batch. */
typedef struct wire_complete_req {
    char transfer_id[WIRE_ID_MAX + 1];
    char reservation_id[WIRE_ID_MAX + 1];
} wire_complete_req;

/* cancel: reservation_id "" when absent; abandon / refresh false when absent. */
typedef struct wire_cancel_req {
    char transfer_id[WIRE_ID_MAX + 1];
    char reservation_id[WIRE_ID_MAX + 1];
    bool abandon;
    bool refresh;
} wire_cancel_req;

typedef struct wire_ctl_request {
    wire_ctl_op op;
    union {
        wire_reserve_req reserve;
        struct {
            size_t n;
            wire_reserve_item *items; /* decoder: heap; encoder: items[i].req is read */
        } reserve_batch;
        struct {
            char transfer_id[WIRE_ID_MAX + 1];
        } status;
        wire_complete_req complete;
        struct {
            size_t n;
            wire_complete_req *items;
        } complete_batch;
        wire_cancel_req cancel;
        /* ect_put: the item, and the spare it was written into
         * ("reservation_id" on the wire) */
        struct {
            wire_reserve_req item;
            char spare_id[WIRE_ID_MAX + 1];
        } put;
        /* ect_ready: items with a readiness seq above `after`, ready for
         * at least age_ms ("age_ms", optional: 0 when absent, and the
         * encoder omits 0), at most `max` (1..WIRE_BATCH_MAX; the encoder
         * omits 0, the decoder gives WIRE_READY_DEFAULT for an absent "max") */
        struct {
            uint64_t after;
            uint32_t max;
            uint64_t age_ms;
        } ready;
        /* event_port and peers carry no fields. */
    } u;
    /* reserve, reserve_batch: "ect_shm_id" (extension, docs/PROTOCOL.md
     * "shm", "Offers"), the producer's shm initiator id; 0: absent. */
    uint64_t shm_id;
    /* reserve, reserve_batch, ect_put: "ect_spare" (extension, docs/PROTOCOL.md
     * "a spare range granted ahead"), the bytes of the spare range asked
     * for; 0: absent */
    uint64_t spare;
} wire_ctl_request;

/* Encodes {"op": ..., fields...}. Batch items are encoded without "op". */
int wire_ctl_encode_request(const wire_ctl_request *req, char **out);
/* Decodes any request; dispatches on "op". See the return codes above. */
int wire_ctl_decode_request(const void *buf, size_t len, wire_ctl_request *out);
void wire_ctl_request_clear(wire_ctl_request *req);

/* Memory a server keeps from one request (or reply) to the next for a
 * batch's items: a shard decoding reserve_batch after reserve_batch then
 * allocates (and zeroes fresh pages for) no item array per request. Starts
 * zeroed; wire_ctl_keep_free frees it. */
typedef struct wire_ctl_keep {
    void *mem;
    size_t cap; /* bytes */
} wire_ctl_keep;

/* Room for at least `bytes` (the contents are not kept); false out of memory. */
bool wire_ctl_keep_reserve(wire_ctl_keep *k, size_t bytes);
void wire_ctl_keep_free(wire_ctl_keep *k);

/* wire_ctl_decode_request with a batch's items in keep's memory (when the
 * fast path decodes it; NULL keep: on the heap). Such a request is cleared
 * by wire_ctl_request_clear_kept, which leaves keep's memory alone. */
int wire_ctl_decode_request_kept(const void *buf, size_t len, wire_ctl_request *out,
                                 wire_ctl_keep *keep);
void wire_ctl_request_clear_kept(wire_ctl_request *req, const wire_ctl_keep *keep);

/* The reply a server sends for a request that failed wire_ctl_decode_request
 * with `rc`: WIRE_CTL_MALFORMED for ECT_EPROTO, else the error text
 * ect_last_error() holds. Call it right after the failed decode. */
int wire_ctl_encode_decode_failure(int rc, char **out);

/* -------------------------------------------------------------- results */

/* reserve. cancelled: the transfer was cancelled before it was reserved; the
 * encoder then writes exactly the cancelled form {reservation_id: "",
 * dst_session: "", dst_ptr: 0, write: false, ready: false, cancelled: true}
 * followed by the extension `reason` when set, and ignores the other fields.
 * transport and dst_key are this project's extensions (the data plane's back
 * end and the destination region's key); "" / NULL when absent, and only
 * written when set. reason (cancelled form only): why the transfer_id is
 * refused, a sentence ("already delivered: ..."); "" when absent. */
typedef struct wire_reserve_result {
    bool cancelled;
    char reservation_id[WIRE_ID_MAX + 1];
    char dst_session[WIRE_SESSION_MAX + 1];
    uint64_t dst_ptr;
    uint64_t nbytes;
    bool write;
    bool ready;
    bool cached;
    char transport[WIRE_TRANSPORT_MAX + 1];
    char *dst_key; /* owned after decoding; NULL when absent */
    char reason[WIRE_REASON_MAX + 1];
} wire_reserve_result;

/* One item of a reserve_batch result: {ok: true, result} or {ok: false, error}. */
typedef struct wire_reserve_outcome {
    bool ok;
    char *error; /* when !ok; owned after decoding */
    wire_reserve_result result;
} wire_reserve_outcome;

/* status: found == false is the JSON null (no such transfer). */
typedef struct wire_status_result {
    bool found;
    char mm_hash[WIRE_ID_MAX + 1];
    bool ready;
    char reservation_id[WIRE_ID_MAX + 1];
    wire_tensor tensor;
} wire_status_result;

typedef struct wire_complete_result {
    bool completed;
    bool became_ready;
} wire_complete_result;

/* One item of an ect_ready result: the readiness event's facts and the
 * item's readiness seq on that shard (>= 1, ascending along the list). */
typedef struct wire_ready_item {
    uint64_t seq;
    char transfer_id[WIRE_ID_MAX + 1];
    char mm_hash[WIRE_ID_MAX + 1];
    char reservation_id[WIRE_ID_MAX + 1];
    wire_tensor tensor;
} wire_ready_item;

typedef struct wire_ctl_reply {
    wire_ctl_op op; /* which request this answers: selects the result type */
    bool ok;
    char *error; /* when !ok; owned after decoding */
    /* extension of the event_port reply, beside "result" (docs/PROTOCOL.md
     * "Event-port secret"): the PLAIN password the event port asks for; ""
     * when absent (keys on, event auth off, or an upstream shard) */
    char event_secret[WIRE_SECRET_MAX + 1];
    /* extension of the reserve, reserve_batch and ect_put replies, beside
     * "result" (docs/PROTOCOL.md "a spare range granted ahead"): the spare
     * range granted; has_spare false when absent. spare.write is true. */
    bool has_spare;
    wire_reserve_result spare;
    union {
        wire_reserve_result reserve;
        struct {
            size_t n;
            wire_reserve_outcome *items;
        } reserve_batch;
        wire_status_result status;
        uint16_t event_port; /* 1..65535 */
        struct {
            size_t n; /* 1..WIRE_PEERS_MAX */
            uint16_t *ports;
            /* extension: the shards' data plane ("tcp", "shm", "ucx"), so a
             * producer can check it before reserving; "" when absent */
            char transport[WIRE_TRANSPORT_MAX + 1];
        } peers;
        wire_complete_result complete; /* complete, ect_put */
        struct {
            size_t n;
            wire_complete_result *items;
        } complete_batch;
        bool cancelled; /* cancel: {"cancelled": bool} */
        /* ect_status: the result object as compact JSON text; owned after
         * decoding, borrowed (not freed by the clear) when the caller set it
         * for encoding and cleared it before wire_ctl_reply_clear */
        char *ect_status;
        /* ect_ready: the items (owned after decoding), the cursor to ask
         * with next (>= the last item's seq) and whether more remain */
        struct {
            size_t n;
            wire_ready_item *items;
            uint64_t next;
            bool more;
        } ready;
    } u;
} wire_ctl_reply;

/* Encodes {"ok": true, "result": ...} for rep->op, or {"ok": false, "error":
 * rep->error} when !rep->ok. */
int wire_ctl_encode_reply(const wire_ctl_reply *rep, char **out);
/* {"ok": false, "error": text}. */
int wire_ctl_encode_error(const char *text, char **out);
/* Decodes the reply to a request of type `op`. For the batch ops,
 * expect_items is the number of items the request carried and a result with
 * another count is refused; for ect_ready it is the request's max and a
 * longer list is refused; SIZE_MAX skips the check. An {"ok": false} reply
 * decodes successfully with ok == false and the error text. */
int wire_ctl_decode_reply(wire_ctl_op op, size_t expect_items, const void *buf, size_t len,
                          wire_ctl_reply *out);
void wire_ctl_reply_clear(wire_ctl_reply *rep);
/* wire_ctl_reply_clear of a reply whose batch items lie in keep's memory
 * (a server's reply_items): their strings are freed, the array is not. */
void wire_ctl_reply_clear_kept(wire_ctl_reply *rep, const wire_ctl_keep *keep);

/* --------------------------------------------------------------- events */

/* Readiness (ready == true) and abandoned (ready == false) events, PUSH ->
 * PULL. Upstream sends {transfer_id, **status, shard}; an abandoned event has
 * the same keys with ready false, and this project adds "abandoned": true and
 * an optional "error" reason. A decoder takes ready == false as abandoned
 * whether or not "abandoned" is present. */
typedef struct wire_event {
    char transfer_id[WIRE_ID_MAX + 1];
    char mm_hash[WIRE_ID_MAX + 1];
    bool ready;
    char reservation_id[WIRE_ID_MAX + 1];
    wire_tensor tensor;
    uint16_t shard; /* control port of the shard that sent it */
    char *error;    /* abandoned: reason or NULL; owned after decoding */
} wire_event;

int wire_ctl_encode_event(const wire_event *ev, char **out);
int wire_ctl_decode_event(const void *buf, size_t len, wire_event *out);
void wire_event_clear(wire_event *ev);

/* ---- internal to the codec (control_*.c); not for other modules. */
#include <jansson.h>

/* Checks the frame (size, NUL bytes, nesting, integers beyond int64, naming
 * the path) and parses it into an object. Caller owns *out. */
int wctl_load(const void *buf, size_t len, json_t **out);
/* Dumps compact JSON into *out and releases root in every case. */
int wctl_dump(json_t *root, char **out);
const char *wctl_type_name(const json_t *v);
/* Field getters: `pfx` is prepended to key in error texts ("items[3]."). */
int wctl_get_str(const json_t *obj, const char *pfx, const char *key, bool required, bool nonempty,
                 size_t max, char *dst);
int wctl_get_str_dup(const json_t *obj, const char *pfx, const char *key, bool required, size_t max,
                     char **dst);
int wctl_get_u64(const json_t *obj, const char *pfx, const char *key, bool required, uint64_t *dst);
int wctl_get_bool(const json_t *obj, const char *pfx, const char *key, bool required, bool *dst);
int wctl_get_port(const json_t *obj, const char *pfx, const char *key, uint16_t *dst);
int wctl_port_value(const json_t *v, const char *pfx, const char *name, uint16_t *dst);
int wctl_get_tensor(const json_t *obj, const char *pfx, wire_tensor *t);
/* Encoder helpers: each returns 0 or an ECT_E* code with the detail set, and
 * does nothing once *rc is non-zero, so a builder checks rc once at the end. */
/* s must hold at most max bytes (and one at least when nonempty). */
void wctl_put_str(json_t *obj, const char *key, const char *s, size_t max, bool nonempty, int *rc);
/* Error texts: cut to WIRE_ERROR_MAX bytes and made valid UTF-8 ('?' for a
 * bad byte), so a reply can always be sent. */
void wctl_put_text(json_t *obj, const char *key, const char *s, int *rc);
void wctl_put_u64(json_t *obj, const char *key, uint64_t v, int *rc);
void wctl_put_bool(json_t *obj, const char *key, bool v, int *rc);
void wctl_put_new(json_t *obj, const char *key, json_t *v, int *rc);
void wctl_put_tensor(json_t *obj, const wire_tensor *t, int *rc);
/* Length of the valid UTF-8 sequence at p (jansson's rules), or 0. Reads
 * p[1..3] only while they continue the sequence. */
size_t wctl_utf8_seq(const unsigned char *p);

/* "ect_shm_id": 16 lowercase hex digits of a non-zero u64. Parse: true and
 * *id for exactly that (n bytes at s); format: 17 bytes with the NUL. */
bool wctl_shm_id_parse(const char *s, size_t n, uint64_t *id);
void wctl_shm_id_format(uint64_t id, char out[17]);

/* control_fast.c: the allocation-light path for the reserve_batch and
 * complete_batch requests and replies and the readiness event (encoded and
 * decoded). Each returns 0 (done, same result as
 * the jansson path), ECT_ENOMEM, or WCTL_FALLBACK: not handled, nothing
 * changed, the caller runs the jansson path from the start (which words every
 * error). wctl_fast_off (false) turns the fast path off, for the tests and
 * fuzz targets that compare both paths; set it only while no codec call runs. */
#define WCTL_FALLBACK 1
extern bool wctl_fast_off;
int wctl_fast_encode_request(const wire_ctl_request *req, char **out);
int wctl_fast_encode_reply(const wire_ctl_reply *rep, char **out);
int wctl_fast_encode_event(const wire_event *ev, char **out);
int wctl_fast_decode_request(const void *buf, size_t len, wire_ctl_request *out);
int wctl_fast_decode_request_kept(const void *buf, size_t len, wire_ctl_request *out,
                                  wire_ctl_keep *keep);
int wctl_fast_decode_reply(wire_ctl_op op, size_t expect, const void *buf, size_t len,
                           wire_ctl_reply *out);
int wctl_fast_decode_event(const void *buf, size_t len, wire_event *out);

#endif
