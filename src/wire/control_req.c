/*
 * control_req — the push control requests: {"op": NAME, fields...}.
 *
 * One decoder dispatches on "op" so a control server needs a single call per
 * frame. Its failures map onto the three replies upstream gives: a frame that
 * is not a JSON object (WIRE_CTL_MALFORMED), an op it does not know
 * ("unknown control op: 'x'", worded like Python's repr of the value), and a
 * bad field (the text names it). reserve_batch is the exception the protocol
 * demands: each item is judged on its own, so one bad item becomes that
 * item's error and the others are still served.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "wire/control_msg.h"

/* Longest op text quoted back in "unknown control op: ..." (then "..."). */
#define OP_QUOTE_MAX 64
/* Longest op name we send. */
#define OP_NAME_MAX 16

void wire_ctl_request_clear_kept(wire_ctl_request *req, const wire_ctl_keep *keep) {
    if (!req) return;
    void *items = req->op == WIRE_OP_RESERVE_BATCH    ? (void *)req->u.reserve_batch.items
                  : req->op == WIRE_OP_COMPLETE_BATCH ? (void *)req->u.complete_batch.items
                                                      : NULL;
    if (!keep || items != keep->mem) free(items);
    memset(req, 0, sizeof *req);
}

void wire_ctl_request_clear(wire_ctl_request *req) { wire_ctl_request_clear_kept(req, NULL); }

bool wire_ctl_keep_reserve(wire_ctl_keep *k, size_t bytes) {
    if (k->cap >= bytes) return true;
    size_t cap = k->cap ? k->cap : 4096;
    while (cap < bytes) cap *= 2;
    void *m = realloc(k->mem, cap);
    if (!m) return false;
    k->mem = m;
    k->cap = cap;
    return true;
}

void wire_ctl_keep_free(wire_ctl_keep *k) {
    free(k->mem);
    k->mem = NULL;
    k->cap = 0;
}

/* ------------------------------------------------------------ encoding */

bool wctl_shm_id_parse(const char *s, size_t n, uint64_t *id) {
    uint64_t v = 0;
    if (n != 16) return false;
    for (size_t i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        v = (v << 4) | (uint64_t)d;
    }
    *id = v;
    return v != 0;
}

void wctl_shm_id_format(uint64_t id, char out[17]) { snprintf(out, 17, "%016" PRIx64, id); }

/* The optional "ect_shm_id" of reserve and reserve_batch (last key). */
static void put_shm_id(json_t *o, uint64_t id, int *rc) {
    char h[17];
    if (!o || !id) return;
    wctl_shm_id_format(id, h);
    wctl_put_str(o, "ect_shm_id", h, 16, true, rc);
}

/* The optional "ect_spare" of reserve, reserve_batch and ect_put (after
 * ect_shm_id): the bytes of the spare range asked for. */
static void put_spare(json_t *o, uint64_t spare, int *rc) {
    if (spare) wctl_put_u64(o, "ect_spare", spare, rc);
}

static int get_spare(const json_t *root, uint64_t *spare) {
    return wctl_get_u64(root, "", "ect_spare", false, spare);
}

static int get_shm_id(const json_t *root, uint64_t *id) {
    char h[WIRE_ID_MAX + 1];
    int rc = wctl_get_str(root, "", "ect_shm_id", false, false, WIRE_ID_MAX, h);
    if (rc == 0 && json_object_get(root, "ect_shm_id") && !wctl_shm_id_parse(h, strlen(h), id))
        rc = ect_set_error(ECT_EINVAL, "ect_shm_id: expected 16 lowercase hex digits, not all 0");
    return rc;
}

static json_t *reserve_obj(const wire_reserve_req *r, const char *op, int *rc) {
    json_t *o = json_object();
    if (!o) {
        *rc = ect_set_error(ECT_ENOMEM, "out of memory encoding JSON");
        return NULL;
    }
    if (op) wctl_put_str(o, "op", op, OP_NAME_MAX, true, rc);
    wctl_put_str(o, "transfer_id", r->transfer_id, WIRE_ID_MAX, true, rc);
    wctl_put_str(o, "mm_hash", r->mm_hash, WIRE_ID_MAX, true, rc);
    wctl_put_tensor(o, &r->tensor, rc);
    return o;
}

static json_t *complete_obj(const wire_complete_req *c, const char *op, int *rc) {
    json_t *o = json_object();
    if (!o) {
        *rc = ect_set_error(ECT_ENOMEM, "out of memory encoding JSON");
        return NULL;
    }
    if (op) wctl_put_str(o, "op", op, OP_NAME_MAX, true, rc);
    wctl_put_str(o, "transfer_id", c->transfer_id, WIRE_ID_MAX, true, rc);
    wctl_put_str(o, "reservation_id", c->reservation_id, WIRE_ID_MAX, false, rc);
    return o;
}

static int check_batch(size_t n, const void *items) {
    if (n > WIRE_BATCH_MAX)
        return ect_set_error(ECT_EINVAL, "items: %zu items, at most %d allowed", n, WIRE_BATCH_MAX);
    if (n && !items) return ect_set_error(ECT_EINVAL, "items: NULL array");
    return 0;
}

/* ect_ready: {"op","after","max","age_ms"}; max 0 is left out (the shard's
 * default), age_ms 0 too. */
static json_t *ready_obj(const wire_ctl_request *req, const char *op, int *rc) {
    uint32_t max = req->u.ready.max;
    if (max > WIRE_BATCH_MAX) {
        *rc = ect_set_error(ECT_EINVAL, "max: %" PRIu32 " outside 1..%d", max, WIRE_BATCH_MAX);
        return NULL;
    }
    json_t *o = json_object();
    wctl_put_str(o, "op", op, OP_NAME_MAX, true, rc);
    wctl_put_u64(o, "after", req->u.ready.after, rc);
    if (max) wctl_put_u64(o, "max", max, rc);
    if (req->u.ready.age_ms) wctl_put_u64(o, "age_ms", req->u.ready.age_ms, rc);
    return o;
}

int wire_ctl_encode_request(const wire_ctl_request *req, char **out) {
    *out = NULL;
    const char *op = req ? wire_ctl_op_name(req->op) : NULL;
    if (!op) return ect_set_error(ECT_EINVAL, "op: not a control op");
    int rc = wctl_fast_encode_request(req, out);
    if (rc != WCTL_FALLBACK) return rc;
    rc = 0;
    json_t *o = NULL;
    switch (req->op) {
    case WIRE_OP_RESERVE:
        o = reserve_obj(&req->u.reserve, op, &rc);
        put_shm_id(o, req->shm_id, &rc);
        put_spare(o, req->spare, &rc);
        break;
    case WIRE_OP_ECT_PUT:
        o = reserve_obj(&req->u.put.item, op, &rc);
        wctl_put_str(o, "reservation_id", req->u.put.spare_id, WIRE_ID_MAX, true, &rc);
        put_shm_id(o, req->shm_id, &rc);
        put_spare(o, req->spare, &rc);
        break;
    case WIRE_OP_COMPLETE: o = complete_obj(&req->u.complete, op, &rc); break;
    case WIRE_OP_RESERVE_BATCH:
    case WIRE_OP_COMPLETE_BATCH: {
        bool rsv = req->op == WIRE_OP_RESERVE_BATCH;
        size_t n = rsv ? req->u.reserve_batch.n : req->u.complete_batch.n;
        const void *items = rsv ? (const void *)req->u.reserve_batch.items
                                : (const void *)req->u.complete_batch.items;
        if ((rc = check_batch(n, items))) return rc;
        o = json_object();
        json_t *arr = json_array();
        wctl_put_str(o, "op", op, OP_NAME_MAX, true, &rc);
        for (size_t i = 0; arr && i < n && !rc; i++) {
            if (rsv && req->u.reserve_batch.items[i].rc) {
                rc = ect_set_error(ECT_EINVAL, "items[%zu]: an item that did not decode", i);
                break;
            }
            json_t *it = rsv ? reserve_obj(&req->u.reserve_batch.items[i].req, NULL, &rc)
                             : complete_obj(&req->u.complete_batch.items[i], NULL, &rc);
            if (!rc && json_array_append_new(arr, it))
                rc = ect_set_error(ECT_ENOMEM, "items: out of memory encoding JSON");
            else if (rc)
                json_decref(it);
        }
        if (o)
            wctl_put_new(o, "items", arr, &rc);
        else
            json_decref(arr);
        if (rsv) put_shm_id(o, req->shm_id, &rc);
        if (rsv) put_spare(o, req->spare, &rc);
        break;
    }
    case WIRE_OP_STATUS:
        o = json_object();
        wctl_put_str(o, "op", op, OP_NAME_MAX, true, &rc);
        wctl_put_str(o, "transfer_id", req->u.status.transfer_id, WIRE_ID_MAX, true, &rc);
        break;
    case WIRE_OP_EVENT_PORT:
    case WIRE_OP_PEERS:
    case WIRE_OP_ECT_STATUS:
        o = json_object();
        wctl_put_str(o, "op", op, OP_NAME_MAX, true, &rc);
        break;
    case WIRE_OP_CANCEL:
        o = json_object();
        wctl_put_str(o, "op", op, OP_NAME_MAX, true, &rc);
        wctl_put_str(o, "transfer_id", req->u.cancel.transfer_id, WIRE_ID_MAX, true, &rc);
        wctl_put_str(o, "reservation_id", req->u.cancel.reservation_id, WIRE_ID_MAX, false, &rc);
        wctl_put_bool(o, "abandon", req->u.cancel.abandon, &rc);
        wctl_put_bool(o, "refresh", req->u.cancel.refresh, &rc);
        break;
    case WIRE_OP_ECT_READY: o = ready_obj(req, op, &rc); break;
    }
    if (!o && !rc) rc = ect_set_error(ECT_ENOMEM, "out of memory encoding JSON");
    if (rc) {
        json_decref(o);
        return rc;
    }
    return wctl_dump(o, out);
}

/* ------------------------------------------------------------ decoding */

/* Python's repr() of a str, as upstream's f"{op!r}" prints it: single quotes
 * unless the text holds a single quote and no double quote; backslash and
 * control characters escaped; long texts cut at OP_QUOTE_MAX bytes. */
static void py_repr_str(const char *s, size_t n, char *out, size_t cap) {
    bool dq = memchr(s, '\'', n) && !memchr(s, '"', n);
    char q = dq ? '"' : '\'';
    size_t o = 0;
    out[o++] = q;
    size_t lim = n > OP_QUOTE_MAX ? OP_QUOTE_MAX : n;
    for (size_t i = 0; i < lim && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\' || c == (unsigned char)q) {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c == '\n') {
            out[o++] = '\\', out[o++] = 'n';
        } else if (c == '\r') {
            out[o++] = '\\', out[o++] = 'r';
        } else if (c == '\t') {
            out[o++] = '\\', out[o++] = 't';
        } else if (c < 0x20 || c == 0x7f) {
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
        } else {
            out[o++] = (char)c;
        }
    }
    if (lim < n && o + 4 < cap) {
        /* Do not end inside a UTF-8 sequence. */
        while (o > 1 && ((unsigned char)out[o - 1] & 0xC0) == 0x80) o--;
        if (o > 1 && ((unsigned char)out[o - 1] & 0xC0) == 0xC0) o--;
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o++] = q;
    out[o] = '\0';
}

static int unknown_op(const json_t *v) {
    char text[OP_QUOTE_MAX * 4 + 16];
    if (!v || json_is_null(v)) {
        snprintf(text, sizeof text, "None");
    } else if (json_is_string(v)) {
        py_repr_str(json_string_value(v), json_string_length(v), text, sizeof text);
    } else if (json_is_boolean(v)) {
        snprintf(text, sizeof text, "%s", json_is_true(v) ? "True" : "False");
    } else if (json_is_integer(v)) {
        snprintf(text, sizeof text, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    } else {
        /* Reals, arrays and objects: their JSON text, which is close to repr. */
        char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        snprintf(text, sizeof text, "%.*s", OP_QUOTE_MAX, d ? d : "?");
        free(d);
    }
    return ect_set_error(ECT_ENOTSUP, "unknown control op: %s", text);
}

static int parse_op(const json_t *root, wire_ctl_op *op) {
    const json_t *v = json_object_get(root, "op");
    if (json_is_string(v)) {
        for (int i = WIRE_OP_RESERVE; i <= WIRE_OP_LAST; i++) {
            const char *name = wire_ctl_op_name((wire_ctl_op)i);
            if (strlen(name) == json_string_length(v) && strcmp(name, json_string_value(v)) == 0) {
                *op = (wire_ctl_op)i;
                return 0;
            }
        }
    }
    return unknown_op(v);
}

static int decode_reserve(const json_t *o, const char *pfx, wire_reserve_req *r) {
    memset(r, 0, sizeof *r);
    if (!json_is_object(o)) {
        /* pfx is "items[i]." here: name the item without the trailing dot. */
        size_t n = strlen(pfx);
        return ect_set_error(ECT_EINVAL, "%.*s: expected an object, got %s", (int)(n ? n - 1 : 0),
                             pfx, wctl_type_name(o));
    }
    int rc = wctl_get_str(o, pfx, "transfer_id", true, true, WIRE_ID_MAX, r->transfer_id);
    if (!rc) rc = wctl_get_str(o, pfx, "mm_hash", true, true, WIRE_ID_MAX, r->mm_hash);
    if (!rc) rc = wctl_get_tensor(o, pfx, &r->tensor);
    return rc;
}

static int decode_complete(const json_t *o, const char *pfx, wire_complete_req *c) {
    memset(c, 0, sizeof *c);
    if (!json_is_object(o)) {
        size_t n = strlen(pfx);
        return ect_set_error(ECT_EINVAL, "%.*s: expected an object, got %s", (int)(n ? n - 1 : 0),
                             pfx, wctl_type_name(o));
    }
    int rc = wctl_get_str(o, pfx, "transfer_id", true, true, WIRE_ID_MAX, c->transfer_id);
    if (!rc)
        rc = wctl_get_str(o, pfx, "reservation_id", true, false, WIRE_ID_MAX, c->reservation_id);
    return rc;
}

/* The items array of a batch request: present, an array, within bounds. */
static int get_items(const json_t *root, const json_t **arr, size_t *n) {
    *arr = json_object_get(root, "items");
    if (!*arr) return ect_set_error(ECT_EINVAL, "items: missing");
    if (!json_is_array(*arr))
        return ect_set_error(ECT_EINVAL, "items: expected an array, got %s", wctl_type_name(*arr));
    *n = json_array_size(*arr);
    if (*n > WIRE_BATCH_MAX)
        return ect_set_error(ECT_EINVAL, "items: %zu items, at most %d allowed", *n,
                             WIRE_BATCH_MAX);
    return 0;
}

static int decode_reserve_batch(const json_t *root, wire_ctl_request *out) {
    const json_t *arr;
    size_t n = 0;
    int rc = get_items(root, &arr, &n);
    if (rc) return rc;
    wire_reserve_item *items = calloc(n ? n : 1, sizeof *items);
    if (!items) return ect_set_error(ECT_ENOMEM, "items: out of memory");
    for (size_t i = 0; i < n; i++) {
        char pfx[32];
        snprintf(pfx, sizeof pfx, "items[%zu].", i);
        items[i].rc = decode_reserve(json_array_get(arr, i), pfx, &items[i].req);
        if (items[i].rc) {
            if (items[i].rc == ECT_ENOMEM) {
                free(items);
                return ECT_ENOMEM;
            }
            snprintf(items[i].error, sizeof items[i].error, "%s", ect_last_error());
            memset(&items[i].req, 0, sizeof items[i].req);
        }
    }
    out->u.reserve_batch.n = n;
    out->u.reserve_batch.items = items;
    return 0;
}

static int decode_complete_batch(const json_t *root, wire_ctl_request *out) {
    const json_t *arr;
    size_t n = 0;
    int rc = get_items(root, &arr, &n);
    if (rc) return rc;
    wire_complete_req *items = calloc(n ? n : 1, sizeof *items);
    if (!items) return ect_set_error(ECT_ENOMEM, "items: out of memory");
    for (size_t i = 0; i < n; i++) {
        char pfx[32];
        snprintf(pfx, sizeof pfx, "items[%zu].", i);
        if ((rc = decode_complete(json_array_get(arr, i), pfx, &items[i]))) {
            free(items);
            return rc;
        }
    }
    out->u.complete_batch.n = n;
    out->u.complete_batch.items = items;
    return 0;
}

/* ect_ready: "after" required, "max" 1..WIRE_BATCH_MAX or absent, "age_ms"
 * optional. */
static int decode_ready(const json_t *root, wire_ctl_request *out) {
    uint64_t max = 0;
    int rc = wctl_get_u64(root, "", "after", true, &out->u.ready.after);
    if (!rc) rc = wctl_get_u64(root, "", "max", false, &max);
    if (!rc) rc = wctl_get_u64(root, "", "age_ms", false, &out->u.ready.age_ms);
    if (rc) return rc;
    if (!json_object_get(root, "max")) max = WIRE_READY_DEFAULT;
    if (max < 1 || max > WIRE_BATCH_MAX)
        return ect_set_error(ECT_EINVAL, "max: %" PRIu64 " outside 1..%d", max, WIRE_BATCH_MAX);
    out->u.ready.max = (uint32_t)max;
    return 0;
}

static int decode_body(const json_t *root, wire_ctl_request *out) {
    wire_cancel_req *c = &out->u.cancel;
    int rc;
    switch (out->op) {
    case WIRE_OP_RESERVE:
        rc = decode_reserve(root, "", &out->u.reserve);
        if (!rc) rc = get_shm_id(root, &out->shm_id);
        return rc ? rc : get_spare(root, &out->spare);
    case WIRE_OP_RESERVE_BATCH:
        rc = get_shm_id(root, &out->shm_id);
        if (!rc) rc = get_spare(root, &out->spare);
        return rc ? rc : decode_reserve_batch(root, out);
    case WIRE_OP_ECT_PUT:
        rc = decode_reserve(root, "", &out->u.put.item);
        if (!rc)
            rc = wctl_get_str(root, "", "reservation_id", true, true, WIRE_ID_MAX,
                              out->u.put.spare_id);
        if (!rc) rc = get_shm_id(root, &out->shm_id);
        return rc ? rc : get_spare(root, &out->spare);
    case WIRE_OP_STATUS:
        return wctl_get_str(root, "", "transfer_id", true, true, WIRE_ID_MAX,
                            out->u.status.transfer_id);
    case WIRE_OP_EVENT_PORT:
    case WIRE_OP_PEERS:
    case WIRE_OP_ECT_STATUS: return 0;
    case WIRE_OP_COMPLETE: return decode_complete(root, "", &out->u.complete);
    case WIRE_OP_COMPLETE_BATCH: return decode_complete_batch(root, out);
    case WIRE_OP_CANCEL:
        rc = wctl_get_str(root, "", "transfer_id", true, true, WIRE_ID_MAX, c->transfer_id);
        if (!rc)
            rc = wctl_get_str(root, "", "reservation_id", false, false, WIRE_ID_MAX,
                              c->reservation_id);
        if (!rc) rc = wctl_get_bool(root, "", "abandon", false, &c->abandon);
        if (!rc) rc = wctl_get_bool(root, "", "refresh", false, &c->refresh);
        return rc;
    case WIRE_OP_ECT_READY: return decode_ready(root, out);
    }
    return ect_set_error(ECT_EINVAL, "op: not a control op");
}

int wire_ctl_decode_request(const void *buf, size_t len, wire_ctl_request *out) {
    return wire_ctl_decode_request_kept(buf, len, out, NULL);
}

int wire_ctl_decode_request_kept(const void *buf, size_t len, wire_ctl_request *out,
                                 wire_ctl_keep *keep) {
    int rc = wctl_fast_decode_request_kept(buf, len, out, keep);
    if (rc != WCTL_FALLBACK) return rc;
    memset(out, 0, sizeof *out);
    json_t *root;
    rc = wctl_load(buf, len, &root);
    if (rc) return rc;
    rc = parse_op(root, &out->op);
    if (!rc) rc = decode_body(root, out);
    json_decref(root);
    if (rc) wire_ctl_request_clear(out);
    return rc;
}
