/*
 * control_reply — the reply envelope {"ok": true, "result": R} /
 * {"ok": false, "error": "text"} and every result R of the push control ops.
 *
 * A reply does not say which op it answers; REQ/REP pairs each reply with the
 * request just sent, so the decoder takes the op from its caller. For the
 * batch ops the caller also passes the number of items it sent: a result list
 * of another length cannot be matched to the items and is refused.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "wire/control_msg.h"

static void reserve_result_clear(wire_reserve_result *r) {
    free(r->dst_key);
    memset(r, 0, sizeof *r);
}

/* Frees what a reserve_batch's outcomes own (not the array). */
static void outcomes_clear(wire_reserve_outcome *items, size_t n) {
    for (size_t i = 0; items && i < n; i++) {
        free(items[i].error);
        items[i].error = NULL;
        reserve_result_clear(&items[i].result);
    }
}

void wire_ctl_reply_clear_kept(wire_ctl_reply *rep, const wire_ctl_keep *keep) {
    if (!rep) return;
    if (keep && rep->ok && rep->op == WIRE_OP_RESERVE_BATCH &&
        (void *)rep->u.reserve_batch.items == keep->mem) {
        outcomes_clear(rep->u.reserve_batch.items, rep->u.reserve_batch.n);
        rep->u.reserve_batch.items = NULL;
    }
    if (keep && rep->ok && rep->op == WIRE_OP_COMPLETE_BATCH &&
        (void *)rep->u.complete_batch.items == keep->mem)
        rep->u.complete_batch.items = NULL;
    wire_ctl_reply_clear(rep);
}

void wire_ctl_reply_clear(wire_ctl_reply *rep) {
    if (!rep) return;
    free(rep->error);
    if (rep->ok) {
        reserve_result_clear(&rep->spare);
        switch (rep->op) {
        case WIRE_OP_RESERVE: reserve_result_clear(&rep->u.reserve); break;
        case WIRE_OP_RESERVE_BATCH:
            outcomes_clear(rep->u.reserve_batch.items, rep->u.reserve_batch.n);
            free(rep->u.reserve_batch.items);
            break;
        case WIRE_OP_PEERS: free(rep->u.peers.ports); break;
        case WIRE_OP_COMPLETE_BATCH: free(rep->u.complete_batch.items); break;
        case WIRE_OP_ECT_STATUS: free(rep->u.ect_status); break;
        case WIRE_OP_ECT_READY: free(rep->u.ready.items); break;
        default: break;
        }
    }
    memset(rep, 0, sizeof *rep);
}

/* ------------------------------------------------------------ encoding */

static json_t *new_obj(int *rc) {
    json_t *o = *rc ? NULL : json_object();
    if (!o && !*rc) *rc = ect_set_error(ECT_ENOMEM, "out of memory encoding JSON");
    return o;
}

static json_t *reserve_result_obj(const wire_reserve_result *r, int *rc) {
    json_t *o = new_obj(rc);
    if (!o) return NULL;
    if (r->cancelled) {
        wctl_put_str(o, "reservation_id", "", WIRE_ID_MAX, false, rc);
        wctl_put_str(o, "dst_session", "", WIRE_SESSION_MAX, false, rc);
        wctl_put_u64(o, "dst_ptr", 0, rc);
        wctl_put_bool(o, "write", false, rc);
        wctl_put_bool(o, "ready", false, rc);
        wctl_put_bool(o, "cancelled", true, rc);
        if (r->reason[0]) wctl_put_text(o, "reason", r->reason, rc);
        return o;
    }
    wctl_put_str(o, "reservation_id", r->reservation_id, WIRE_ID_MAX, false, rc);
    wctl_put_str(o, "dst_session", r->dst_session, WIRE_SESSION_MAX, false, rc);
    wctl_put_u64(o, "dst_ptr", r->dst_ptr, rc);
    wctl_put_u64(o, "nbytes", r->nbytes, rc);
    wctl_put_bool(o, "write", r->write, rc);
    wctl_put_bool(o, "ready", r->ready, rc);
    wctl_put_bool(o, "cached", r->cached, rc);
    if (r->transport[0]) wctl_put_str(o, "transport", r->transport, WIRE_TRANSPORT_MAX, false, rc);
    if (r->dst_key) wctl_put_str(o, "dst_key", r->dst_key, WIRE_KEY_MAX, false, rc);
    return o;
}

/* The "ect_spare" object beside a result: a reserve result's keys less the
 * flags (a spare is always written, never ready nor cached). */
static json_t *spare_obj(const wire_reserve_result *r, int *rc) {
    json_t *o = new_obj(rc);
    if (!o) return NULL;
    wctl_put_str(o, "reservation_id", r->reservation_id, WIRE_ID_MAX, true, rc);
    wctl_put_str(o, "dst_session", r->dst_session, WIRE_SESSION_MAX, false, rc);
    wctl_put_u64(o, "dst_ptr", r->dst_ptr, rc);
    wctl_put_u64(o, "nbytes", r->nbytes, rc);
    if (r->transport[0]) wctl_put_str(o, "transport", r->transport, WIRE_TRANSPORT_MAX, false, rc);
    if (r->dst_key) wctl_put_str(o, "dst_key", r->dst_key, WIRE_KEY_MAX, false, rc);
    return o;
}

static json_t *complete_result_obj(const wire_complete_result *c, int *rc) {
    json_t *o = new_obj(rc);
    wctl_put_bool(o, "completed", c->completed, rc);
    wctl_put_bool(o, "became_ready", c->became_ready, rc);
    return o;
}

/* Appends v to arr; consumes v in every case. */
static void append(json_t *arr, json_t *v, int *rc) {
    if (*rc) {
        json_decref(v);
        return;
    }
    if (!v || json_array_append_new(arr, v))
        *rc = ect_set_error(ECT_ENOMEM, "items: out of memory encoding JSON");
}

/* ect_ready: {"items":[{seq, transfer_id, mm_hash, reservation_id, nbytes,
 * shape, dtype}...], "next", "more"}; the decoder's checks hold. */
static json_t *ready_result_obj(const wire_ctl_reply *rep, int *rc) {
    size_t n = rep->u.ready.n;
    const wire_ready_item *items = rep->u.ready.items;
    if (n > WIRE_BATCH_MAX || (n && !items)) {
        *rc = ect_set_error(ECT_EINVAL, "items: NULL or over %d", WIRE_BATCH_MAX);
        return NULL;
    }
    json_t *o = new_obj(rc), *arr = json_array();
    for (size_t i = 0; arr && i < n && !*rc; i++) {
        if (!items[i].seq || (i && items[i].seq <= items[i - 1].seq) ||
            items[i].seq > rep->u.ready.next)
            *rc = ect_set_error(ECT_EINVAL, "items[%zu].seq: not ascending from 1 up to next", i);
        json_t *io = new_obj(rc);
        wctl_put_u64(io, "seq", items[i].seq, rc);
        wctl_put_str(io, "transfer_id", items[i].transfer_id, WIRE_ID_MAX, true, rc);
        wctl_put_str(io, "mm_hash", items[i].mm_hash, WIRE_ID_MAX, true, rc);
        wctl_put_str(io, "reservation_id", items[i].reservation_id, WIRE_ID_MAX, false, rc);
        wctl_put_tensor(io, &items[i].tensor, rc);
        append(arr, io, rc);
    }
    wctl_put_new(o, "items", arr, rc);
    wctl_put_u64(o, "next", rep->u.ready.next, rc);
    wctl_put_bool(o, "more", rep->u.ready.more, rc);
    return o;
}

static json_t *result_json(const wire_ctl_reply *rep, int *rc) {
    json_t *o = NULL, *arr = NULL;
    switch (rep->op) {
    case WIRE_OP_RESERVE: return reserve_result_obj(&rep->u.reserve, rc);
    case WIRE_OP_RESERVE_BATCH:
        if (rep->u.reserve_batch.n > WIRE_BATCH_MAX ||
            (rep->u.reserve_batch.n && !rep->u.reserve_batch.items)) {
            *rc = ect_set_error(ECT_EINVAL, "items: NULL or over %d", WIRE_BATCH_MAX);
            return NULL;
        }
        o = new_obj(rc);
        arr = json_array();
        for (size_t i = 0; arr && i < rep->u.reserve_batch.n && !*rc; i++) {
            const wire_reserve_outcome *it = &rep->u.reserve_batch.items[i];
            json_t *io = new_obj(rc);
            wctl_put_bool(io, "ok", it->ok, rc);
            if (it->ok)
                wctl_put_new(io, "result", reserve_result_obj(&it->result, rc), rc);
            else
                wctl_put_text(io, "error", it->error, rc);
            append(arr, io, rc);
        }
        wctl_put_new(o, "items", arr, rc);
        return o;
    case WIRE_OP_STATUS:
        if (!rep->u.status.found) return json_null();
        o = new_obj(rc);
        wctl_put_str(o, "mm_hash", rep->u.status.mm_hash, WIRE_ID_MAX, true, rc);
        wctl_put_bool(o, "ready", rep->u.status.ready, rc);
        wctl_put_str(o, "reservation_id", rep->u.status.reservation_id, WIRE_ID_MAX, false, rc);
        wctl_put_tensor(o, &rep->u.status.tensor, rc);
        return o;
    case WIRE_OP_EVENT_PORT:
        if (rep->u.event_port == 0) {
            *rc = ect_set_error(ECT_EINVAL, "result: port 0 is not an event port");
            return NULL;
        }
        return json_integer(rep->u.event_port);
    case WIRE_OP_PEERS:
        if (rep->u.peers.n == 0 || rep->u.peers.n > WIRE_PEERS_MAX || !rep->u.peers.ports) {
            *rc = ect_set_error(ECT_EINVAL, "ports: NULL, empty or over %d", WIRE_PEERS_MAX);
            return NULL;
        }
        o = new_obj(rc);
        arr = json_array();
        for (size_t i = 0; arr && i < rep->u.peers.n && !*rc; i++) {
            if (rep->u.peers.ports[i] == 0)
                *rc = ect_set_error(ECT_EINVAL, "ports[%zu]: port 0", i);
            append(arr, json_integer(rep->u.peers.ports[i]), rc);
        }
        wctl_put_new(o, "ports", arr, rc);
        if (rep->u.peers.transport[0])
            wctl_put_str(o, "transport", rep->u.peers.transport, WIRE_TRANSPORT_MAX, false, rc);
        return o;
    case WIRE_OP_COMPLETE:
    case WIRE_OP_ECT_PUT: return complete_result_obj(&rep->u.complete, rc);
    case WIRE_OP_COMPLETE_BATCH:
        if (rep->u.complete_batch.n > WIRE_BATCH_MAX ||
            (rep->u.complete_batch.n && !rep->u.complete_batch.items)) {
            *rc = ect_set_error(ECT_EINVAL, "items: NULL or over %d", WIRE_BATCH_MAX);
            return NULL;
        }
        o = new_obj(rc);
        arr = json_array();
        for (size_t i = 0; arr && i < rep->u.complete_batch.n && !*rc; i++)
            append(arr, complete_result_obj(&rep->u.complete_batch.items[i], rc), rc);
        wctl_put_new(o, "items", arr, rc);
        return o;
    case WIRE_OP_CANCEL:
        o = new_obj(rc);
        wctl_put_bool(o, "cancelled", rep->u.cancelled, rc);
        return o;
    case WIRE_OP_ECT_STATUS: {
        json_error_t e;
        o = rep->u.ect_status ? json_loads(rep->u.ect_status, 0, &e) : NULL;
        if (!json_is_object(o)) {
            json_decref(o);
            *rc = ect_set_error(ECT_EINVAL, "result: ect_status needs a JSON object");
            return NULL;
        }
        return o;
    }
    case WIRE_OP_ECT_READY: return ready_result_obj(rep, rc);
    }
    *rc = ect_set_error(ECT_EINVAL, "op: not a control op");
    return NULL;
}

int wire_ctl_encode_reply(const wire_ctl_reply *rep, char **out) {
    *out = NULL;
    if (!rep) return ect_set_error(ECT_EINVAL, "NULL reply");
    if (!rep->ok) return wire_ctl_encode_error(rep->error ? rep->error : "", out);
    int rc = wctl_fast_encode_reply(rep, out);
    if (rc != WCTL_FALLBACK) return rc;
    rc = 0;
    json_t *o = new_obj(&rc);
    wctl_put_bool(o, "ok", true, &rc);
    json_t *r = result_json(rep, &rc);
    if (!r && !rc) rc = ect_set_error(ECT_ENOMEM, "out of memory encoding JSON");
    wctl_put_new(o, "result", r, &rc);
    if (rep->op == WIRE_OP_EVENT_PORT && rep->event_secret[0])
        wctl_put_str(o, "event_secret", rep->event_secret, WIRE_SECRET_MAX, false, &rc);
    if (rep->has_spare) wctl_put_new(o, "ect_spare", spare_obj(&rep->spare, &rc), &rc);
    if (rc) {
        json_decref(o);
        return rc;
    }
    return wctl_dump(o, out);
}

/* ------------------------------------------------------------ decoding */

static int expect_object(const json_t *v, const char *path) {
    if (json_is_object(v)) return 0;
    if (!v) return ect_set_error(ECT_EINVAL, "%s: missing", path);
    return ect_set_error(ECT_EINVAL, "%s: expected an object, got %s", path, wctl_type_name(v));
}

/* pfx ends with '.', path is pfx without it. */
static int decode_reserve_result(const json_t *o, const char *pfx, wire_reserve_result *r) {
    memset(r, 0, sizeof *r);
    char path[64];
    snprintf(path, sizeof path, "%.*s", (int)strlen(pfx) - 1, pfx);
    int rc = expect_object(o, path);
    if (rc) return rc;
    if ((rc = wctl_get_bool(o, pfx, "cancelled", false, &r->cancelled))) return rc;
    /* The cancelled form carries neither nbytes nor cached. */
    bool full = !r->cancelled;
    if (!rc)
        rc = wctl_get_str(o, pfx, "reservation_id", true, false, WIRE_ID_MAX, r->reservation_id);
    if (!rc)
        rc = wctl_get_str(o, pfx, "dst_session", true, false, WIRE_SESSION_MAX, r->dst_session);
    if (!rc) rc = wctl_get_u64(o, pfx, "dst_ptr", true, &r->dst_ptr);
    if (!rc) rc = wctl_get_u64(o, pfx, "nbytes", full, &r->nbytes);
    if (!rc) rc = wctl_get_bool(o, pfx, "write", true, &r->write);
    if (!rc) rc = wctl_get_bool(o, pfx, "ready", true, &r->ready);
    if (!rc) rc = wctl_get_bool(o, pfx, "cached", full, &r->cached);
    if (!rc) rc = wctl_get_str(o, pfx, "transport", false, false, WIRE_TRANSPORT_MAX, r->transport);
    if (!rc) rc = wctl_get_str_dup(o, pfx, "dst_key", false, WIRE_KEY_MAX, &r->dst_key);
    if (!rc && r->cancelled) {
        /* the reason is a courtesy text: a long one is cut, never refused */
        char *why = NULL;
        rc = wctl_get_str_dup(o, pfx, "reason", false, WIRE_ERROR_MAX, &why);
        if (why) snprintf(r->reason, sizeof r->reason, "%s", why);
        free(why);
    }
    if (rc) reserve_result_clear(r);
    return rc;
}

static int decode_complete_result(const json_t *o, const char *pfx, wire_complete_result *c) {
    char path[64];
    snprintf(path, sizeof path, "%.*s", (int)strlen(pfx) - 1, pfx);
    int rc = expect_object(o, path);
    if (!rc) rc = wctl_get_bool(o, pfx, "completed", true, &c->completed);
    if (!rc) rc = wctl_get_bool(o, pfx, "became_ready", true, &c->became_ready);
    return rc;
}

/* The "items" array of a batch result, checked against the expected count. */
static int result_items(const json_t *res, size_t expect, const json_t **arr, size_t *n) {
    int rc = expect_object(res, "result");
    if (rc) return rc;
    *arr = json_object_get(res, "items");
    if (!*arr) return ect_set_error(ECT_EINVAL, "result.items: missing");
    if (!json_is_array(*arr))
        return ect_set_error(ECT_EINVAL, "result.items: expected an array, got %s",
                             wctl_type_name(*arr));
    *n = json_array_size(*arr);
    if (*n > WIRE_BATCH_MAX)
        return ect_set_error(ECT_EINVAL, "result.items: %zu items, at most %d allowed", *n,
                             WIRE_BATCH_MAX);
    if (expect != SIZE_MAX && *n != expect)
        return ect_set_error(ECT_EINVAL, "result.items: %zu results for %zu requested items", *n,
                             expect);
    return 0;
}

static int decode_reserve_batch(const json_t *res, size_t expect, wire_ctl_reply *out) {
    const json_t *arr;
    size_t n = 0;
    int rc = result_items(res, expect, &arr, &n);
    if (rc) return rc;
    wire_reserve_outcome *items = calloc(n ? n : 1, sizeof *items);
    if (!items) return ect_set_error(ECT_ENOMEM, "result.items: out of memory");
    out->u.reserve_batch.items = items;
    for (size_t i = 0; i < n; i++) {
        const json_t *it = json_array_get(arr, i);
        char path[40], pfx[48], rpfx[64];
        snprintf(path, sizeof path, "result.items[%zu]", i);
        snprintf(pfx, sizeof pfx, "%s.", path);
        snprintf(rpfx, sizeof rpfx, "%sresult.", pfx);
        rc = expect_object(it, path);
        if (!rc) rc = wctl_get_bool(it, pfx, "ok", true, &items[i].ok);
        if (!rc && items[i].ok)
            rc = decode_reserve_result(json_object_get(it, "result"), rpfx, &items[i].result);
        else if (!rc)
            rc = wctl_get_str_dup(it, pfx, "error", true, WIRE_ERROR_MAX, &items[i].error);
        out->u.reserve_batch.n = i + 1; /* so _clear frees what was decoded */
        if (rc) return rc;
    }
    out->u.reserve_batch.n = n;
    return 0;
}

/* The optional "ect_spare" object beside the result (NULL: absent). */
static int decode_spare(const json_t *o, wire_ctl_reply *out) {
    if (!o) return 0;
    wire_reserve_result *r = &out->spare;
    int rc = expect_object(o, "ect_spare");
    out->has_spare = true; /* so _clear frees what was decoded */
    r->write = true;
    if (!rc)
        rc = wctl_get_str(o, "ect_spare.", "reservation_id", true, true, WIRE_ID_MAX,
                          r->reservation_id);
    if (!rc)
        rc = wctl_get_str(o, "ect_spare.", "dst_session", true, false, WIRE_SESSION_MAX,
                          r->dst_session);
    if (!rc) rc = wctl_get_u64(o, "ect_spare.", "dst_ptr", true, &r->dst_ptr);
    if (!rc) rc = wctl_get_u64(o, "ect_spare.", "nbytes", true, &r->nbytes);
    if (!rc)
        rc = wctl_get_str(o, "ect_spare.", "transport", false, false, WIRE_TRANSPORT_MAX,
                          r->transport);
    if (!rc) rc = wctl_get_str_dup(o, "ect_spare.", "dst_key", false, WIRE_KEY_MAX, &r->dst_key);
    return rc;
}

static int decode_peers(const json_t *res, wire_ctl_reply *out) {
    int rc = expect_object(res, "result");
    if (rc) return rc;
    const json_t *arr = json_object_get(res, "ports");
    if (!arr) return ect_set_error(ECT_EINVAL, "result.ports: missing");
    if (!json_is_array(arr))
        return ect_set_error(ECT_EINVAL, "result.ports: expected an array, got %s",
                             wctl_type_name(arr));
    size_t n = json_array_size(arr);
    if (n == 0) return ect_set_error(ECT_EINVAL, "result.ports: empty peer list");
    if (n > WIRE_PEERS_MAX)
        return ect_set_error(ECT_EINVAL, "result.ports: %zu ports, at most %d allowed", n,
                             WIRE_PEERS_MAX);
    uint16_t *ports = calloc(n, sizeof *ports);
    if (!ports) return ect_set_error(ECT_ENOMEM, "result.ports: out of memory");
    out->u.peers.ports = ports;
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "ports[%zu]", i);
        if ((rc = wctl_port_value(json_array_get(arr, i), "result.", name, &ports[i]))) return rc;
    }
    out->u.peers.n = n;
    return wctl_get_str(res, "result.", "transport", false, false, WIRE_TRANSPORT_MAX,
                        out->u.peers.transport);
}

/* One ect_ready item; its seq must be above prev (0 for the first). */
static int decode_ready_item(const json_t *it, size_t i, uint64_t prev, wire_ready_item *r) {
    char path[40], pfx[48];
    snprintf(path, sizeof path, "result.items[%zu]", i);
    snprintf(pfx, sizeof pfx, "%s.", path);
    int rc = expect_object(it, path);
    if (!rc) rc = wctl_get_u64(it, pfx, "seq", true, &r->seq);
    if (!rc && r->seq <= prev)
        rc = ect_set_error(ECT_EINVAL, "%sseq: %" PRIu64 " is not above %" PRIu64, pfx, r->seq,
                           prev);
    if (!rc) rc = wctl_get_str(it, pfx, "transfer_id", true, true, WIRE_ID_MAX, r->transfer_id);
    if (!rc) rc = wctl_get_str(it, pfx, "mm_hash", true, true, WIRE_ID_MAX, r->mm_hash);
    if (!rc)
        rc = wctl_get_str(it, pfx, "reservation_id", true, false, WIRE_ID_MAX, r->reservation_id);
    if (!rc) rc = wctl_get_tensor(it, pfx, &r->tensor);
    return rc;
}

/* ect_ready: at most `max` items, seqs ascending from 1, next >= the last. */
static int decode_ready(const json_t *res, size_t max, wire_ctl_reply *out) {
    const json_t *arr;
    size_t n = 0;
    int rc = result_items(res, SIZE_MAX, &arr, &n);
    if (rc) return rc;
    if (max != SIZE_MAX && n > max)
        return ect_set_error(ECT_EINVAL, "result.items: %zu items, asked for at most %zu", n, max);
    rc = wctl_get_u64(res, "result.", "next", true, &out->u.ready.next);
    if (!rc) rc = wctl_get_bool(res, "result.", "more", true, &out->u.ready.more);
    if (rc) return rc;
    out->u.ready.items = calloc(n ? n : 1, sizeof *out->u.ready.items);
    if (!out->u.ready.items) return ect_set_error(ECT_ENOMEM, "result.items: out of memory");
    out->u.ready.n = n;
    for (size_t i = 0; i < n && !rc; i++)
        rc = decode_ready_item(json_array_get(arr, i), i, i ? out->u.ready.items[i - 1].seq : 0,
                               &out->u.ready.items[i]);
    if (!rc && n && out->u.ready.next < out->u.ready.items[n - 1].seq)
        rc = ect_set_error(ECT_EINVAL, "result.next: %" PRIu64 " is below the last item's seq",
                           out->u.ready.next);
    return rc;
}

static int decode_result(const json_t *res, size_t expect, wire_ctl_reply *out) {
    int rc;
    const json_t *arr;
    size_t n = 0;
    wire_status_result *st = &out->u.status;
    switch (out->op) {
    case WIRE_OP_RESERVE: return decode_reserve_result(res, "result.", &out->u.reserve);
    case WIRE_OP_RESERVE_BATCH: return decode_reserve_batch(res, expect, out);
    case WIRE_OP_STATUS:
        if (json_is_null(res)) return 0;
        if ((rc = expect_object(res, "result"))) return rc;
        st->found = true;
        rc = wctl_get_str(res, "result.", "mm_hash", true, true, WIRE_ID_MAX, st->mm_hash);
        if (!rc) rc = wctl_get_bool(res, "result.", "ready", true, &st->ready);
        if (!rc)
            rc = wctl_get_str(res, "result.", "reservation_id", true, false, WIRE_ID_MAX,
                              st->reservation_id);
        if (!rc) rc = wctl_get_tensor(res, "result.", &st->tensor);
        return rc;
    case WIRE_OP_EVENT_PORT: return wctl_port_value(res, "", "result", &out->u.event_port);
    case WIRE_OP_PEERS: return decode_peers(res, out);
    case WIRE_OP_COMPLETE:
    case WIRE_OP_ECT_PUT: return decode_complete_result(res, "result.", &out->u.complete);
    case WIRE_OP_COMPLETE_BATCH:
        if ((rc = result_items(res, expect, &arr, &n))) return rc;
        out->u.complete_batch.items = calloc(n ? n : 1, sizeof *out->u.complete_batch.items);
        if (!out->u.complete_batch.items)
            return ect_set_error(ECT_ENOMEM, "result.items: out of memory");
        out->u.complete_batch.n = n;
        for (size_t i = 0; i < n; i++) {
            char pfx[48];
            snprintf(pfx, sizeof pfx, "result.items[%zu].", i);
            rc = decode_complete_result(json_array_get(arr, i), pfx,
                                        &out->u.complete_batch.items[i]);
            if (rc) return rc;
        }
        return 0;
    case WIRE_OP_CANCEL:
        if ((rc = expect_object(res, "result"))) return rc;
        return wctl_get_bool(res, "result.", "cancelled", true, &out->u.cancelled);
    case WIRE_OP_ECT_STATUS:
        if ((rc = expect_object(res, "result"))) return rc;
        out->u.ect_status = json_dumps(res, JSON_COMPACT | JSON_PRESERVE_ORDER);
        return out->u.ect_status ? 0 : ect_set_error(ECT_ENOMEM, "result: out of memory");
    case WIRE_OP_ECT_READY: return decode_ready(res, expect, out);
    }
    return ect_set_error(ECT_EINVAL, "op: not a control op");
}

int wire_ctl_decode_reply(wire_ctl_op op, size_t expect_items, const void *buf, size_t len,
                          wire_ctl_reply *out) {
    memset(out, 0, sizeof *out);
    if (!wire_ctl_op_name(op)) return ect_set_error(ECT_EINVAL, "op: not a control op");
    int rc = wctl_fast_decode_reply(op, expect_items, buf, len, out);
    if (rc != WCTL_FALLBACK) return rc;
    json_t *root;
    rc = wctl_load(buf, len, &root);
    if (rc) return rc;
    out->op = op;
    rc = wctl_get_bool(root, "", "ok", true, &out->ok);
    if (!rc && !out->ok)
        rc = wctl_get_str_dup(root, "", "error", true, WIRE_ERROR_MAX, &out->error);
    if (!rc && out->ok) {
        /* A missing result is refused; a present JSON null is status's "no such transfer". */
        const json_t *res = json_object_get(root, "result");
        rc = res ? decode_result(res, expect_items, out)
                 : ect_set_error(ECT_EINVAL, "result: missing");
        if (!rc && op == WIRE_OP_EVENT_PORT)
            rc = wctl_get_str(root, "", "event_secret", false, false, WIRE_SECRET_MAX,
                              out->event_secret);
        if (!rc && (op == WIRE_OP_RESERVE || op == WIRE_OP_RESERVE_BATCH || op == WIRE_OP_ECT_PUT))
            rc = decode_spare(json_object_get(root, "ect_spare"), out);
    }
    json_decref(root);
    if (rc) {
        int keep = rc;
        wire_ctl_reply_clear(out);
        return keep;
    }
    return 0;
}
