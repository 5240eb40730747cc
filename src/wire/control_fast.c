/*
 * control_fast — an allocation-light codec for the four hot messages of the
 * push control path: the reserve_batch and complete_batch requests and their
 * replies (issue 13: jansson's tree, its mallocs and the dump's vfprintf were
 * a third of the CPU per small item), the readiness event a shard sends per
 * item (encoder and decoder), and event_port and its reply: the exchange
 * ect_push_ping times as the control round trip that `ect bench push`
 * measures a step's latency against, which must cost no more codec than the
 * step's own exchanges do.
 *
 * It is a fast path, never a second definition of the wire. The encoders
 * write the very bytes jansson's compact dump writes (keys in the order
 * docs/PROTOCOL.md lists, '"' and '\\' escaped, UTF-8 as is); the decoders
 * accept only the plain form (keys in that order, each once, no escapes, no
 * unknown keys, integers without sign, fraction or exponent) with any JSON
 * whitespace between tokens. Whatever they do not handle in full (a value a
 * decoder would refuse, a control character, an escape, another key order,
 * an upstream peer's spacing with other keys, any error) they hand back
 * WCTL_FALLBACK untouched, and the jansson codec in control_req.c /
 * control_reply.c takes it from the start, so every error text, every
 * refusal and every unusual-but-valid frame is exactly as before.
 * fuzz_control_msg checks both halves against each other: whatever the fast
 * path decodes, jansson decodes to the same struct; whatever it encodes,
 * jansson encodes to the same bytes.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "wire/control_msg.h"

bool wctl_fast_off;

/* ------------------------------------------------------------ writer */

typedef struct {
    char *p;
    size_t n, cap;
    bool bad; /* fall back: a value the fast path does not write */
    bool oom;
} jw;

static void jw_reserve(jw *w, size_t more) {
    if (w->bad || w->oom || w->n + more + 1 <= w->cap) return;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->n + more + 1) cap *= 2;
    char *p = realloc(w->p, cap);
    if (!p) {
        w->oom = true;
        return;
    }
    w->p = p;
    w->cap = cap;
}

static void jw_lit(jw *w, const char *s, size_t n) {
    jw_reserve(w, n);
    if (w->bad || w->oom) return;
    memcpy(w->p + w->n, s, n);
    w->n += n;
}
#define JW_LIT(w, s) jw_lit((w), (s), sizeof(s) - 1)

static void jw_bool(jw *w, bool v) {
    if (v)
        JW_LIT(w, "true");
    else
        JW_LIT(w, "false");
}

static void jw_u64(jw *w, uint64_t v) {
    if (v > (uint64_t)INT64_MAX) {
        w->bad = true;
        return;
    }
    char d[24];
    size_t k = sizeof d;
    do {
        d[--k] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    jw_lit(w, d + k, sizeof d - k);
}

/* A JSON string as jansson writes it; anything it would escape other than
 * '"' and '\\', invalid UTF-8, a text over max or an empty one where one is
 * required makes the writer fall back. */
static void jw_str(jw *w, const char *s, size_t max, bool nonempty) {
    if (w->bad || w->oom) return;
    if (!s) s = "";
    size_t n = strnlen(s, max + 1);
    if (n > max || (nonempty && n == 0)) {
        w->bad = true;
        return;
    }
    jw_reserve(w, 2 * n + 2);
    if (w->oom) return;
    char *o = w->p + w->n;
    *o++ = '"';
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c < 0x80) {
            if (c < 0x20) {
                w->bad = true;
                return;
            }
            if (c == '"' || c == '\\') *o++ = '\\';
            *o++ = (char)c;
            i++;
            continue;
        }
        size_t k = wctl_utf8_seq(p + i);
        if (!k || i + k > n) {
            w->bad = true;
            return;
        }
        memcpy(o, p + i, k);
        o += k;
        i += k;
    }
    *o++ = '"';
    w->n = (size_t)(o - w->p);
}

static int jw_done(jw *w, char **out) {
    if (w->oom) {
        free(w->p);
        return ect_set_error(ECT_ENOMEM, "out of memory encoding JSON");
    }
    if (w->bad) {
        free(w->p);
        return WCTL_FALLBACK;
    }
    w->p[w->n] = '\0';
    *out = w->p;
    return 0;
}

static void jw_tensor(jw *w, const wire_tensor *t) {
    if (t->ndim > WIRE_MAX_NDIM || !wire_dtype_canonical(t->dtype) ||
        wire_check_nbytes(t->dtype, t->shape, t->ndim, t->nbytes, "nbytes")) {
        w->bad = true;
        return;
    }
    JW_LIT(w, "\"nbytes\":");
    jw_u64(w, t->nbytes);
    JW_LIT(w, ",\"shape\":[");
    for (uint32_t i = 0; i < t->ndim; i++) {
        if (i) JW_LIT(w, ",");
        jw_u64(w, t->shape[i]);
    }
    JW_LIT(w, "],\"dtype\":");
    jw_str(w, t->dtype, WIRE_DTYPE_MAX, true);
}

/* Our producer's request extensions, in the jansson path's order: the
 * "ect_shm_id" and "ect_spare" keys when set. */
static void jw_exts(jw *w, const wire_ctl_request *req) {
    if (req->shm_id) {
        char h[17];
        wctl_shm_id_format(req->shm_id, h);
        JW_LIT(w, ",\"ect_shm_id\":\"");
        jw_lit(w, h, 16);
        JW_LIT(w, "\"");
    }
    if (req->spare) {
        JW_LIT(w, ",\"ect_spare\":");
        jw_u64(w, req->spare);
    }
}

/* A reserve's fields, as a reserve_batch item and ect_put carry them:
 * "transfer_id":...,"mm_hash":...,then the tensor's keys (the twin of the
 * reader's jr_reserve_fields). */
static void jw_reserve_fields(jw *w, const wire_reserve_req *q) {
    JW_LIT(w, "\"transfer_id\":");
    jw_str(w, q->transfer_id, WIRE_ID_MAX, true);
    JW_LIT(w, ",\"mm_hash\":");
    jw_str(w, q->mm_hash, WIRE_ID_MAX, true);
    JW_LIT(w, ",");
    jw_tensor(w, &q->tensor);
}

int wctl_fast_encode_request(const wire_ctl_request *req, char **out) {
    *out = NULL;
    if (wctl_fast_off || !req) return WCTL_FALLBACK;
    jw w = {0};
    if (req->op == WIRE_OP_RESERVE_BATCH) {
        size_t n = req->u.reserve_batch.n;
        if (n > WIRE_BATCH_MAX || (n && !req->u.reserve_batch.items)) return WCTL_FALLBACK;
        jw_reserve(&w, 64 + n * 192);
        JW_LIT(&w, "{\"op\":\"reserve_batch\",\"items\":[");
        for (size_t i = 0; i < n && !w.bad; i++) {
            const wire_reserve_item *it = &req->u.reserve_batch.items[i];
            if (it->rc) w.bad = true;
            if (i) JW_LIT(&w, ",");
            JW_LIT(&w, "{");
            jw_reserve_fields(&w, &it->req);
            JW_LIT(&w, "}");
        }
        JW_LIT(&w, "]");
        jw_exts(&w, req);
        JW_LIT(&w, "}");
    } else if (req->op == WIRE_OP_ECT_PUT) {
        jw_reserve(&w, 256);
        JW_LIT(&w, "{\"op\":\"ect_put\",");
        jw_reserve_fields(&w, &req->u.put.item);
        JW_LIT(&w, ",\"reservation_id\":");
        jw_str(&w, req->u.put.spare_id, WIRE_ID_MAX, true);
        jw_exts(&w, req);
        JW_LIT(&w, "}");
    } else if (req->op == WIRE_OP_COMPLETE_BATCH) {
        size_t n = req->u.complete_batch.n;
        if (n > WIRE_BATCH_MAX || (n && !req->u.complete_batch.items)) return WCTL_FALLBACK;
        jw_reserve(&w, 64 + n * 128);
        JW_LIT(&w, "{\"op\":\"complete_batch\",\"items\":[");
        for (size_t i = 0; i < n && !w.bad; i++) {
            const wire_complete_req *it = &req->u.complete_batch.items[i];
            if (i) JW_LIT(&w, ",");
            JW_LIT(&w, "{\"transfer_id\":");
            jw_str(&w, it->transfer_id, WIRE_ID_MAX, true);
            JW_LIT(&w, ",\"reservation_id\":");
            jw_str(&w, it->reservation_id, WIRE_ID_MAX, false);
            JW_LIT(&w, "}");
        }
        JW_LIT(&w, "]}");
    } else if (req->op == WIRE_OP_EVENT_PORT) {
        JW_LIT(&w, "{\"op\":\"event_port\"}");
    } else {
        return WCTL_FALLBACK;
    }
    return jw_done(&w, out);
}

/* A granted range's first keys, as a reserve result and a spare start
 * (reservation_id non-empty when id_needed). */
static void jw_range_head(jw *w, const wire_reserve_result *r, bool id_needed) {
    JW_LIT(w, "\"reservation_id\":");
    jw_str(w, r->reservation_id, WIRE_ID_MAX, id_needed);
    JW_LIT(w, ",\"dst_session\":");
    jw_str(w, r->dst_session, WIRE_SESSION_MAX, false);
    JW_LIT(w, ",\"dst_ptr\":");
    jw_u64(w, r->dst_ptr);
    JW_LIT(w, ",\"nbytes\":");
    jw_u64(w, r->nbytes);
}

/* A granted range's optional last keys: transport, dst_key. */
static void jw_range_tail(jw *w, const wire_reserve_result *r) {
    if (r->transport[0]) {
        JW_LIT(w, ",\"transport\":");
        jw_str(w, r->transport, WIRE_TRANSPORT_MAX, false);
    }
    if (r->dst_key) {
        JW_LIT(w, ",\"dst_key\":");
        jw_str(w, r->dst_key, WIRE_KEY_MAX, false);
    }
}

static void jw_reserve_result(jw *w, const wire_reserve_result *r) {
    if (r->cancelled) { /* rare: the jansson path writes it */
        w->bad = true;
        return;
    }
    JW_LIT(w, "{");
    jw_range_head(w, r, false);
    JW_LIT(w, ",\"write\":");
    jw_bool(w, r->write);
    JW_LIT(w, ",\"ready\":");
    jw_bool(w, r->ready);
    JW_LIT(w, ",\"cached\":");
    jw_bool(w, r->cached);
    jw_range_tail(w, r);
    JW_LIT(w, "}");
}

/* The "ect_spare" object beside a result, as the jansson path writes it. */
static void jw_spare(jw *w, const wire_ctl_reply *rep) {
    if (!rep->has_spare) return;
    const wire_reserve_result *r = &rep->spare;
    JW_LIT(w, ",\"ect_spare\":{");
    jw_range_head(w, r, true);
    jw_range_tail(w, r);
    JW_LIT(w, "}");
}

int wctl_fast_encode_reply(const wire_ctl_reply *rep, char **out) {
    *out = NULL;
    if (wctl_fast_off || !rep || !rep->ok) return WCTL_FALLBACK;
    if (rep->has_spare && rep->op != WIRE_OP_RESERVE_BATCH && rep->op != WIRE_OP_ECT_PUT)
        return WCTL_FALLBACK;
    jw w = {0};
    if (rep->op == WIRE_OP_RESERVE_BATCH) {
        size_t n = rep->u.reserve_batch.n;
        if (n > WIRE_BATCH_MAX || (n && !rep->u.reserve_batch.items)) return WCTL_FALLBACK;
        jw_reserve(&w, 64 + n * 256);
        JW_LIT(&w, "{\"ok\":true,\"result\":{\"items\":[");
        for (size_t i = 0; i < n && !w.bad; i++) {
            const wire_reserve_outcome *it = &rep->u.reserve_batch.items[i];
            if (i) JW_LIT(&w, ",");
            if (it->ok) {
                JW_LIT(&w, "{\"ok\":true,\"result\":");
                jw_reserve_result(&w, &it->result);
            } else {
                /* an error text is cut and cleaned by the jansson path; here
                 * only one that needs neither */
                JW_LIT(&w, "{\"ok\":false,\"error\":");
                jw_str(&w, it->error, WIRE_ERROR_MAX - 1, false);
            }
            JW_LIT(&w, "}");
        }
        JW_LIT(&w, "]}");
        jw_spare(&w, rep);
        JW_LIT(&w, "}");
    } else if (rep->op == WIRE_OP_ECT_PUT) {
        jw_reserve(&w, 320);
        JW_LIT(&w, "{\"ok\":true,\"result\":{\"completed\":");
        jw_bool(&w, rep->u.complete.completed);
        JW_LIT(&w, ",\"became_ready\":");
        jw_bool(&w, rep->u.complete.became_ready);
        JW_LIT(&w, "}");
        jw_spare(&w, rep);
        JW_LIT(&w, "}");
    } else if (rep->op == WIRE_OP_COMPLETE_BATCH) {
        size_t n = rep->u.complete_batch.n;
        if (n > WIRE_BATCH_MAX || (n && !rep->u.complete_batch.items)) return WCTL_FALLBACK;
        jw_reserve(&w, 64 + n * 48);
        JW_LIT(&w, "{\"ok\":true,\"result\":{\"items\":[");
        for (size_t i = 0; i < n; i++) {
            const wire_complete_result *c = &rep->u.complete_batch.items[i];
            if (i) JW_LIT(&w, ",");
            JW_LIT(&w, "{\"completed\":");
            jw_bool(&w, c->completed);
            JW_LIT(&w, ",\"became_ready\":");
            jw_bool(&w, c->became_ready);
            JW_LIT(&w, "}");
        }
        JW_LIT(&w, "]}}");
    } else if (rep->op == WIRE_OP_EVENT_PORT) {
        if (!rep->u.event_port) return WCTL_FALLBACK; /* refused: jansson's text */
        JW_LIT(&w, "{\"ok\":true,\"result\":");
        jw_u64(&w, rep->u.event_port);
        if (rep->event_secret[0]) {
            JW_LIT(&w, ",\"event_secret\":");
            jw_str(&w, rep->event_secret, WIRE_SECRET_MAX, false);
        }
        JW_LIT(&w, "}");
    } else {
        return WCTL_FALLBACK;
    }
    return jw_done(&w, out);
}

/* A readiness event (the one a shard sends per item); an abandoned one (an
 * error text to cut and clean) is the jansson path's. */
int wctl_fast_encode_event(const wire_event *ev, char **out) {
    *out = NULL;
    if (wctl_fast_off || !ev || !ev->ready) return WCTL_FALLBACK;
    jw w = {0};
    jw_reserve(&w, 192);
    JW_LIT(&w, "{\"transfer_id\":");
    jw_str(&w, ev->transfer_id, WIRE_ID_MAX, true);
    JW_LIT(&w, ",\"mm_hash\":");
    jw_str(&w, ev->mm_hash, WIRE_ID_MAX, true);
    JW_LIT(&w, ",\"ready\":true,\"reservation_id\":");
    jw_str(&w, ev->reservation_id, WIRE_ID_MAX, false);
    JW_LIT(&w, ",");
    jw_tensor(&w, &ev->tensor);
    JW_LIT(&w, ",\"shard\":");
    jw_u64(&w, ev->shard);
    JW_LIT(&w, "}");
    return jw_done(&w, out);
}

/* ------------------------------------------------------------ reader */

/* A cursor over the frame; `bad` set means fall back. */
typedef struct {
    const unsigned char *p, *end;
    bool bad;
} jr;

static void jr_ws(jr *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

/* Consumes the punctuation c (after whitespace). */
static bool jr_ch(jr *r, char c) {
    if (r->bad) return false;
    jr_ws(r);
    if (r->p < r->end && *r->p == (unsigned char)c) {
        r->p++;
        return true;
    }
    r->bad = true;
    return false;
}

/* The next char after whitespace is c (not consumed). */
static bool jr_peek(jr *r, char c) {
    jr_ws(r);
    return !r->bad && r->p < r->end && *r->p == (unsigned char)c;
}

/* A string without escapes or control bytes, valid UTF-8: *s points into the
 * frame, *n its length. */
static bool jr_raw_str(jr *r, const char **s, size_t *n) {
    if (!jr_ch(r, '"')) return false;
    const unsigned char *b = r->p;
    while (r->p < r->end) {
        unsigned char c = *r->p;
        if (c == '"') {
            *s = (const char *)b;
            *n = (size_t)(r->p - b);
            r->p++;
            return true;
        }
        if (c < 0x20 || c == '\\') break;
        if (c < 0x80) {
            r->p++;
            continue;
        }
        /* wctl_utf8_seq reads up to 4 bytes: make sure they are in the frame */
        if ((size_t)(r->end - r->p) < 4) {
            unsigned char tmp[4] = {0};
            memcpy(tmp, r->p, (size_t)(r->end - r->p));
            size_t k = wctl_utf8_seq(tmp);
            if (!k || k > (size_t)(r->end - r->p)) break;
            r->p += k;
            continue;
        }
        size_t k = wctl_utf8_seq(r->p);
        if (!k) break;
        r->p += k;
    }
    r->bad = true;
    return false;
}

/* The next key is `k` (not consumed, no whitespace issues: a key is a string). */
static bool jr_next_key_is(jr *r, const char *k) {
    jr_ws(r);
    size_t n = strlen(k);
    return !r->bad && (size_t)(r->end - r->p) > n + 1 && r->p[0] == '"' &&
           memcmp(r->p + 1, k, n) == 0 && r->p[n + 1] == '"';
}

/* The key `k` exactly, then ':'. Compared in place: the bytes "k" are the
 * only string that decodes to k here (an escape is refused anyway). */
static bool jr_key(jr *r, const char *k) {
    if (r->bad) return false;
    if (!jr_next_key_is(r, k)) {
        r->bad = true;
        return false;
    }
    r->p += strlen(k) + 2;
    return jr_ch(r, ':');
}

/* A string value into dst (max bytes, NUL-terminated). */
static void jr_str(jr *r, char *dst, size_t max, bool nonempty) {
    const char *s;
    size_t n;
    if (!jr_raw_str(r, &s, &n)) return;
    if (n > max || (nonempty && n == 0) || memchr(s, '\0', n)) {
        r->bad = true;
        return;
    }
    memcpy(dst, s, n);
    dst[n] = '\0';
}

static char *jr_str_dup(jr *r, size_t max) {
    const char *s;
    size_t n;
    if (!jr_raw_str(r, &s, &n)) return NULL;
    if (n > max) {
        r->bad = true;
        return NULL;
    }
    char *d = malloc(n + 1);
    if (!d) {
        r->bad = true; /* the jansson path reports the ENOMEM */
        return NULL;
    }
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* A non-negative integer within int64: digits only, no leading zero. */
static uint64_t jr_u64(jr *r) {
    if (r->bad) return 0;
    jr_ws(r);
    const unsigned char *b = r->p;
    uint64_t v = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        uint64_t d = (uint64_t)(*r->p - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10) {
            r->bad = true;
            return 0;
        }
        v = v * 10 + d;
        r->p++;
    }
    size_t n = (size_t)(r->p - b);
    if (n == 0 || (n > 1 && b[0] == '0') ||
        (r->p < r->end && (*r->p == '.' || *r->p == 'e' || *r->p == 'E'))) {
        r->bad = true;
        return 0;
    }
    return v;
}

static bool jr_bool(jr *r) {
    if (r->bad) return false;
    jr_ws(r);
    size_t left = (size_t)(r->end - r->p);
    if (left >= 4 && memcmp(r->p, "true", 4) == 0) {
        r->p += 4;
        return true;
    }
    if (left >= 5 && memcmp(r->p, "false", 5) == 0) {
        r->p += 5;
        return false;
    }
    r->bad = true;
    return false;
}

/* Only whitespace may follow the top-level object. */
static void jr_end(jr *r) {
    jr_ws(r);
    if (r->p != r->end) r->bad = true;
}

/* "[" then n items parsed by fn, "]"; the count bounded by cap. Returns the
 * number of items or sets bad. The items are on the heap, or with keep in
 * its memory (kept by the caller); each is zeroed just before fn parses it. */
typedef bool (*jr_item_fn)(jr *r, void *arr, size_t i);

/* Room for `n` items of `elem` bytes in *arr (have: how many fit now). */
static bool jr_room(char **arr, size_t *have, size_t n, size_t cap, size_t elem,
                    wire_ctl_keep *keep) {
    if (n < *have) return true;
    size_t nh = *have ? *have * 2 : 32;
    if (nh > cap) nh = cap;
    if (nh < n + 1) nh = n + 1;
    if (keep) {
        if (!wire_ctl_keep_reserve(keep, nh * elem)) return false;
        *arr = keep->mem;
        *have = keep->cap / elem;
        return true;
    }
    char *na = realloc(*arr, nh * elem);
    if (!na) return false;
    *arr = na;
    *have = nh;
    return true;
}

static size_t jr_array_kept(jr *r, size_t cap, size_t elem, void **out, jr_item_fn fn,
                            wire_ctl_keep *keep) {
    *out = NULL;
    if (!jr_ch(r, '[')) return 0;
    size_t n = 0, have = 0;
    char *arr = NULL;
    if (jr_peek(r, ']')) {
        r->p++;
        if (!jr_room(&arr, &have, 0, cap, elem, keep)) r->bad = true;
        if (arr) memset(arr, 0, elem);
        *out = arr;
        return 0;
    }
    for (;;) {
        if (n == cap) {
            r->bad = true;
            break;
        }
        if (!jr_room(&arr, &have, n, cap, elem, keep)) {
            r->bad = true;
            break;
        }
        memset(arr + n * elem, 0, elem);
        if (!fn(r, arr, n)) {
            n++; /* item n may own memory: the caller frees n items */
            r->bad = true;
            break;
        }
        n++;
        if (jr_peek(r, ',')) {
            r->p++;
            continue;
        }
        jr_ch(r, ']');
        break;
    }
    *out = arr;
    return n;
}

static size_t jr_array(jr *r, size_t cap, size_t elem, void **out, jr_item_fn fn) {
    return jr_array_kept(r, cap, elem, out, fn, NULL);
}

/* ------------------------------------------------------------ requests */

/* "nbytes", "shape" and "dtype" in the order jw_tensor writes them; a
 * tensor wctl_get_tensor would refuse (unknown dtype, nbytes against the
 * shape) sets bad: the jansson path words it. */
static void jr_tensor(jr *r, wire_tensor *t) {
    jr_key(r, "nbytes");
    t->nbytes = jr_u64(r);
    jr_ch(r, ',');
    jr_key(r, "shape");
    jr_ch(r, '[');
    if (jr_peek(r, ']')) {
        r->p++;
    } else {
        for (;;) {
            if (t->ndim == WIRE_MAX_NDIM) {
                r->bad = true;
                break;
            }
            t->shape[t->ndim++] = jr_u64(r);
            if (r->bad) break;
            if (jr_peek(r, ',')) {
                r->p++;
                continue;
            }
            jr_ch(r, ']');
            break;
        }
    }
    jr_ch(r, ',');
    jr_key(r, "dtype");
    jr_str(r, t->dtype, WIRE_DTYPE_MAX, true);
    if (r->bad) return;
    if (!wire_dtype_canonical(t->dtype) ||
        wire_check_nbytes(t->dtype, t->shape, t->ndim, t->nbytes, "nbytes"))
        r->bad = true;
}

/* A reserve's fields, as a reserve_batch item and ect_put carry them:
 * "transfer_id":...,"mm_hash":...,then the tensor's keys. */
static void jr_reserve_fields(jr *r, wire_reserve_req *q) {
    jr_key(r, "transfer_id");
    jr_str(r, q->transfer_id, WIRE_ID_MAX, true);
    jr_ch(r, ',');
    jr_key(r, "mm_hash");
    jr_str(r, q->mm_hash, WIRE_ID_MAX, true);
    jr_ch(r, ',');
    jr_tensor(r, &q->tensor);
}

static bool rd_reserve_item(jr *r, void *arr, size_t i) {
    wire_reserve_item *it = (wire_reserve_item *)arr + i;
    jr_ch(r, '{');
    jr_reserve_fields(r, &it->req);
    jr_ch(r, '}');
    return !r->bad;
}

static bool rd_complete_item(jr *r, void *arr, size_t i) {
    wire_complete_req *c = (wire_complete_req *)arr + i;
    jr_ch(r, '{');
    jr_key(r, "transfer_id");
    jr_str(r, c->transfer_id, WIRE_ID_MAX, true);
    jr_ch(r, ',');
    jr_key(r, "reservation_id");
    jr_str(r, c->reservation_id, WIRE_ID_MAX, false);
    jr_ch(r, '}');
    return !r->bad;
}

int wctl_fast_decode_request(const void *buf, size_t len, wire_ctl_request *out) {
    return wctl_fast_decode_request_kept(buf, len, out, NULL);
}

/* Our producer's extensions after a request's fields, exactly as it writes
 * them: ,"ect_shm_id":"..." then ,"ect_spare":N, each optional. */
static void jr_exts(jr *r, uint64_t *shm_id, uint64_t *spare) {
    if (!jr_peek(r, ',')) return;
    r->p++;
    if (jr_next_key_is(r, "ect_shm_id")) {
        const char *h;
        size_t hn;
        jr_key(r, "ect_shm_id");
        if (!jr_raw_str(r, &h, &hn) || !wctl_shm_id_parse(h, hn, shm_id)) r->bad = true;
        if (!jr_peek(r, ',')) return;
        r->p++;
    }
    jr_key(r, "ect_spare");
    *spare = jr_u64(r);
}

/* ect_put after its op: the item, the spare's id, the extensions. */
static int rd_put(jr *r, wire_ctl_request *out) {
    jr_ch(r, ',');
    jr_reserve_fields(r, &out->u.put.item);
    jr_ch(r, ',');
    jr_key(r, "reservation_id");
    jr_str(r, out->u.put.spare_id, WIRE_ID_MAX, true);
    jr_exts(r, &out->shm_id, &out->spare);
    jr_ch(r, '}');
    jr_end(r);
    if (r->bad) {
        memset(out, 0, sizeof *out);
        return WCTL_FALLBACK;
    }
    out->op = WIRE_OP_ECT_PUT;
    return 0;
}

/* The rest of a request that is its op alone ("}"): out->op = op. */
static int rd_bare_op(jr *r, wire_ctl_op op, wire_ctl_request *out) {
    jr_ch(r, '}');
    jr_end(r);
    if (r->bad) return WCTL_FALLBACK;
    out->op = op;
    return 0;
}

int wctl_fast_decode_request_kept(const void *buf, size_t len, wire_ctl_request *out,
                                  wire_ctl_keep *keep) {
    memset(out, 0, sizeof *out);
    if (wctl_fast_off || !buf || len > WIRE_CTL_MAX_FRAME) return WCTL_FALLBACK;
    jr r = {buf, (const unsigned char *)buf + len, false};
    const char *op;
    size_t opn;
    jr_ch(&r, '{');
    jr_key(&r, "op");
    if (!jr_raw_str(&r, &op, &opn)) return WCTL_FALLBACK;
    bool rsv;
    if (opn == 13 && memcmp(op, "reserve_batch", 13) == 0)
        rsv = true;
    else if (opn == 14 && memcmp(op, "complete_batch", 14) == 0)
        rsv = false;
    else if (opn == 10 && memcmp(op, "event_port", 10) == 0)
        return rd_bare_op(&r, WIRE_OP_EVENT_PORT, out);
    else if (opn == 7 && memcmp(op, "ect_put", 7) == 0)
        return rd_put(&r, out);
    else
        return WCTL_FALLBACK;
    jr_ch(&r, ',');
    jr_key(&r, "items");
    void *items = NULL;
    size_t n = 0;
    if (!r.bad)
        n = rsv ? jr_array_kept(&r, WIRE_BATCH_MAX, sizeof(wire_reserve_item), &items,
                                rd_reserve_item, keep)
                : jr_array_kept(&r, WIRE_BATCH_MAX, sizeof(wire_complete_req), &items,
                                rd_complete_item, keep);
    uint64_t shm_id = 0, spare = 0;
    if (rsv) jr_exts(&r, &shm_id, &spare);
    jr_ch(&r, '}');
    jr_end(&r);
    if (r.bad) {
        if (!keep) free(items);
        return WCTL_FALLBACK;
    }
    if (rsv) {
        out->op = WIRE_OP_RESERVE_BATCH;
        out->u.reserve_batch.n = n;
        out->u.reserve_batch.items = items;
        out->shm_id = shm_id;
        out->spare = spare;
    } else {
        out->op = WIRE_OP_COMPLETE_BATCH;
        out->u.complete_batch.n = n;
        out->u.complete_batch.items = items;
    }
    return 0;
}

/* ------------------------------------------------------------- replies */

/* A granted range's first keys, as a reserve result and a spare start:
 * reservation_id (non-empty when id_needed), dst_session, dst_ptr, nbytes. */
static void jr_range_head(jr *r, wire_reserve_result *x, bool id_needed) {
    jr_key(r, "reservation_id");
    jr_str(r, x->reservation_id, WIRE_ID_MAX, id_needed);
    jr_ch(r, ',');
    jr_key(r, "dst_session");
    jr_str(r, x->dst_session, WIRE_SESSION_MAX, false);
    jr_ch(r, ',');
    jr_key(r, "dst_ptr");
    x->dst_ptr = jr_u64(r);
    jr_ch(r, ',');
    jr_key(r, "nbytes");
    x->nbytes = jr_u64(r);
}

/* A granted range's optional last keys: transport, then dst_key, either
 * one absent. */
static void jr_range_tail(jr *r, wire_reserve_result *x) {
    if (!jr_peek(r, ',')) return;
    r->p++;
    if (jr_next_key_is(r, "transport")) {
        jr_key(r, "transport");
        jr_str(r, x->transport, WIRE_TRANSPORT_MAX, false);
        if (!jr_peek(r, ',')) return;
        r->p++;
    }
    jr_key(r, "dst_key");
    x->dst_key = jr_str_dup(r, WIRE_KEY_MAX);
}

static bool rd_reserve_outcome(jr *r, void *arr, size_t i) {
    wire_reserve_outcome *it = (wire_reserve_outcome *)arr + i;
    wire_reserve_result *x = &it->result;
    jr_ch(r, '{');
    jr_key(r, "ok");
    it->ok = jr_bool(r);
    jr_ch(r, ',');
    if (!it->ok) {
        jr_key(r, "error");
        it->error = jr_str_dup(r, WIRE_ERROR_MAX);
        jr_ch(r, '}');
        return !r->bad;
    }
    jr_key(r, "result");
    jr_ch(r, '{');
    jr_range_head(r, x, false);
    jr_ch(r, ',');
    jr_key(r, "write");
    x->write = jr_bool(r);
    jr_ch(r, ',');
    jr_key(r, "ready");
    x->ready = jr_bool(r);
    jr_ch(r, ',');
    jr_key(r, "cached");
    x->cached = jr_bool(r);
    jr_range_tail(r, x);
    jr_ch(r, '}');
    jr_ch(r, '}');
    return !r->bad;
}

static bool rd_complete_result(jr *r, void *arr, size_t i) {
    wire_complete_result *c = (wire_complete_result *)arr + i;
    jr_ch(r, '{');
    jr_key(r, "completed");
    c->completed = jr_bool(r);
    jr_ch(r, ',');
    jr_key(r, "became_ready");
    c->became_ready = jr_bool(r);
    jr_ch(r, '}');
    return !r->bad;
}

/* event_port's reply after "result": the port, then our event_secret
 * extension when there is one. */
static int rd_event_port_reply(jr *r, wire_ctl_reply *out) {
    uint64_t port = jr_u64(r);
    if (!r->bad && (port < 1 || port > 65535)) r->bad = true; /* refused: jansson's text */
    if (jr_peek(r, ',')) {
        jr_ch(r, ',');
        jr_key(r, "event_secret");
        jr_str(r, out->event_secret, WIRE_SECRET_MAX, false);
    }
    jr_ch(r, '}');
    jr_end(r);
    if (r->bad) {
        memset(out, 0, sizeof *out);
        return WCTL_FALLBACK;
    }
    out->op = WIRE_OP_EVENT_PORT;
    out->ok = true;
    out->u.event_port = (uint16_t)port;
    return 0;
}

/* The optional "ect_spare" object beside a result (out->spare). */
static void jr_spare(jr *r, wire_ctl_reply *out) {
    if (!jr_peek(r, ',')) return;
    r->p++;
    wire_reserve_result *x = &out->spare;
    out->has_spare = true; /* so _clear frees what was decoded */
    x->write = true;
    jr_key(r, "ect_spare");
    jr_ch(r, '{');
    jr_range_head(r, x, true);
    jr_range_tail(r, x);
    jr_ch(r, '}');
}

/* ect_put's reply after "result": the complete result, then the spare. */
static int rd_put_reply(jr *r, wire_ctl_reply *out) {
    wire_complete_result c = {0};
    rd_complete_result(r, &c, 0);
    jr_spare(r, out);
    jr_ch(r, '}');
    jr_end(r);
    out->op = WIRE_OP_ECT_PUT;
    out->ok = true;
    out->u.complete = c;
    if (r->bad) {
        wire_ctl_reply_clear(out);
        return WCTL_FALLBACK;
    }
    return 0;
}

int wctl_fast_decode_reply(wire_ctl_op op, size_t expect, const void *buf, size_t len,
                           wire_ctl_reply *out) {
    memset(out, 0, sizeof *out);
    if (wctl_fast_off || !buf || len > WIRE_CTL_MAX_FRAME) return WCTL_FALLBACK;
    bool rsv = op == WIRE_OP_RESERVE_BATCH;
    if (!rsv && op != WIRE_OP_COMPLETE_BATCH && op != WIRE_OP_EVENT_PORT && op != WIRE_OP_ECT_PUT)
        return WCTL_FALLBACK;
    jr r = {buf, (const unsigned char *)buf + len, false};
    jr_ch(&r, '{'); /* {"ok":true,"result": ... */
    jr_key(&r, "ok");
    if (!jr_bool(&r)) return WCTL_FALLBACK;
    jr_ch(&r, ',');
    jr_key(&r, "result");
    if (op == WIRE_OP_EVENT_PORT) return rd_event_port_reply(&r, out);
    if (op == WIRE_OP_ECT_PUT) return rd_put_reply(&r, out);
    jr_ch(&r, '{');
    jr_key(&r, "items");
    void *items = NULL;
    size_t n = 0;
    if (!r.bad)
        n = rsv ? jr_array(&r, WIRE_BATCH_MAX, sizeof(wire_reserve_outcome), &items,
                           rd_reserve_outcome)
                : jr_array(&r, WIRE_BATCH_MAX, sizeof(wire_complete_result), &items,
                           rd_complete_result);
    jr_ch(&r, '}');
    if (rsv) jr_spare(&r, out);
    jr_ch(&r, '}');
    jr_end(&r);
    if (!r.bad && expect != SIZE_MAX && n != expect) r.bad = true;
    out->op = op;
    out->ok = true;
    if (rsv) {
        out->u.reserve_batch.n = n;
        out->u.reserve_batch.items = items;
    } else {
        out->u.complete_batch.n = n;
        out->u.complete_batch.items = items;
    }
    if (r.bad) {
        wire_ctl_reply_clear(out);
        return WCTL_FALLBACK;
    }
    return 0;
}

/* -------------------------------------------------------------- events */

/* The readiness event as wctl_fast_encode_event writes it (a shard sends one
 * per item; the scheduler decoded each with jansson: ~5 % of `ect demo`'s
 * samples). An abandoned event, other keys or another order: jansson's. */
int wctl_fast_decode_event(const void *buf, size_t len, wire_event *out) {
    memset(out, 0, sizeof *out);
    if (wctl_fast_off || !buf || len > WIRE_CTL_MAX_FRAME) return WCTL_FALLBACK;
    jr r = {buf, (const unsigned char *)buf + len, false};
    jr_ch(&r, '{');
    jr_key(&r, "transfer_id");
    jr_str(&r, out->transfer_id, WIRE_ID_MAX, true);
    jr_ch(&r, ',');
    jr_key(&r, "mm_hash");
    jr_str(&r, out->mm_hash, WIRE_ID_MAX, true);
    jr_ch(&r, ',');
    jr_key(&r, "ready");
    out->ready = jr_bool(&r);
    if (!out->ready) r.bad = true;
    jr_ch(&r, ',');
    jr_key(&r, "reservation_id");
    jr_str(&r, out->reservation_id, WIRE_ID_MAX, false);
    jr_ch(&r, ',');
    jr_tensor(&r, &out->tensor);
    jr_ch(&r, ',');
    jr_key(&r, "shard");
    uint64_t shard = jr_u64(&r);
    if (shard < 1 || shard > 65535) r.bad = true;
    jr_ch(&r, '}');
    jr_end(&r);
    if (r.bad) {
        memset(out, 0, sizeof *out);
        return WCTL_FALLBACK;
    }
    out->shard = (uint16_t)shard;
    return 0;
}
