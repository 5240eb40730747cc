/*
 * pull_msg — msgpack codecs of the generation-1 messages (see pull_msg.h).
 *
 * Decoding runs in three steps, so that no input, however hostile, makes the
 * decoder allocate or work more than a small multiple of its length:
 *
 *  1. A structural scan of the raw bytes (scan_*) walks every msgpack object
 *     without allocating. It rejects truncation, trailing bytes, the reserved
 *     byte 0xc1, nesting deeper than WIRE_PULL_MAX_DEPTH, more than
 *     WIRE_PULL_MAX_OBJECTS objects, and containers that declare more entries
 *     than bytes remain. The last check matters: msgpack-c's unpacker
 *     allocates count x sizeof(msgpack_object) for a container as soon as it
 *     reads the header, so a 5-byte `dd ff ff ff ff` would otherwise ask for
 *     ~100 GiB.
 *  2. msgpack_unpack_next builds the object tree in a zone. After step 1 the
 *     zone holds at most ~24 bytes per object (~3 MiB).
 *  3. The typed walk (*_from_obj) binds the top-level keys to the fields,
 *     checks every type and bound, and copies what it keeps into owned
 *     memory. It sees only trees that step 1 has bounded.
 *
 * Encoders validate with the same bounds and emit the smallest msgpack forms
 * (msgpack-c's packer does that), which is also what msgspec emits. The two
 * messages sent once per pull (ECTransferPull, ECTransferComplete) are packed
 * by a small packer of their own into one buffer of their size, byte for
 * byte what msgpack-c makes of them (mp_*; issue 13).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Our messages encode to a few hundred bytes: start the sbuffer there, not
 * at msgpack-c's 8 KiB (a large malloc, and a malloc_consolidate, per
 * message). Only the buffer's first size; the bytes are the same. */
#define MSGPACK_SBUFFER_INIT_SIZE 256
#include <msgpack.h>

#include "util/util.h"
#include "wire/control_msg.h" /* wctl_shm_id_parse, _format */
#include "wire/pull_msg.h"

/* ------------------------------------------------------------ field names */

/* Wire order of the keys of every message: the order msgspec encodes. */
static const char *const notif_keys[] = {"mm_hashes", "shapes", "dtype_strs", "num_bytes_list",
                                         "producer_session_id"};
static const char *const pull_keys[] = {"mm_hash", "dst_ptr", "dst_offset", "consumer_session_id"};
static const char *const complete_keys[] = {"mm_hash", "status"};
static const char *const request_keys[] = {"request_id", "consumer_session_id", "mm_hashes"};
static const char *const ready_keys[] = {"request_id", "mm_hashes",      "shapes",
                                         "dtype_strs", "num_bytes_list", "producer_session_id",
                                         "more"};
#define MAX_FIELDS 7

const char *wire_pull_type_name(wire_pull_type t) {
    switch (t) {
    case WIRE_PULL_NOTIFICATION: return "ECHashNotification";
    case WIRE_PULL_PULL: return "ECTransferPull";
    case WIRE_PULL_COMPLETE: return "ECTransferComplete";
    case WIRE_PULL_REQUEST: return "ECTransferRequest";
    case WIRE_PULL_READY: return "ECTransferReady";
    case WIRE_PULL_PULL_BATCH: return "ECTransferPullBatch";
    case WIRE_PULL_DONE: return "ECTransferDone";
    default: return "unknown";
    }
}

/* ----------------------------------------------------------------- errors */

/* Where a value sits, for error texts: "msg.name[i][j]" (i, j < 0: absent). */
typedef struct fpath {
    const char *msg;
    const char *name;
    long i, j;
} fpath;

static void fpath_str(const fpath *f, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s.%s", f->msg, f->name);
    if (n < 0 || (size_t)n >= cap) return;
    if (f->i >= 0) n += snprintf(buf + n, cap - (size_t)n, "[%ld]", f->i);
    if (n < 0 || (size_t)n >= cap) return;
    if (f->j >= 0) snprintf(buf + n, cap - (size_t)n, "[%ld]", f->j);
}

static int ferr(const fpath *f, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int ferr(const fpath *f, int code, const char *fmt, ...) {
    char where[160], what[256];
    fpath_str(f, where, sizeof where);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ect_set_error(code, "%s: %s", where, what);
}

/* Re-tags the current error detail with `code`, keeping its text (used where
 * a helper such as wire_check_nbytes chose another code). */
static int retag_error(int code) {
    char text[512];
    snprintf(text, sizeof text, "%s", ect_last_error());
    return ect_set_error(code, "%s", text);
}

/* Printable copy of bytes from the peer (a key name) for an error text. */
static void printable(const char *s, size_t n, char *buf, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (k + 4 >= cap && n > k) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k] = '\0';
}

static const char *obj_type_name(const msgpack_object *o) {
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "int";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "float";
    case MSGPACK_OBJECT_STR: return "str";
    case MSGPACK_OBJECT_BIN: return "bin";
    case MSGPACK_OBJECT_ARRAY: return "array";
    case MSGPACK_OBJECT_MAP: return "map";
    case MSGPACK_OBJECT_EXT: return "ext";
    default: return "unknown";
    }
}

/* ------------------------------------------------------------------- text */

/* Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF),
 * as msgspec and Python require of a str. */
static bool utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if (c >= 0xc2 && c <= 0xdf)
            len = 2, cp = c & 0x1f, min = 0x80;
        else if (c >= 0xe0 && c <= 0xef)
            len = 3, cp = c & 0x0f, min = 0x800;
        else if (c >= 0xf0 && c <= 0xf4)
            len = 4, cp = c & 0x07, min = 0x10000;
        else
            return false;
        if (n - i < len) return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += len;
    }
    return true;
}

/* A string field: 1..max bytes of UTF-8 without NUL (we hand it to C). */
static int check_text(const fpath *f, int code, const char *s, size_t n, size_t max) {
    if (n == 0) return ferr(f, code, "must not be empty");
    if (n > max) return ferr(f, code, "string of %zu bytes exceeds the bound of %zu", n, max);
    if (memchr(s, '\0', n)) return ferr(f, code, "contains a NUL byte");
    if (!utf8_valid((const unsigned char *)s, n)) return ferr(f, code, "is not valid UTF-8");
    return 0;
}

/* --------------------------------------------------- step 1: the raw scan */

typedef struct scanner {
    const uint8_t *p;
    size_t len, pos;
    size_t nobj;
    const char *msg;
    /* the top-level str key whose value is being scanned: its bytes in p
     * (made printable only for an error text); klen 0 outside */
    size_t kpos, klen;
} scanner;

static int scan_fail(const scanner *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int scan_fail(const scanner *s, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (s->klen) {
        char key[64];
        printable((const char *)s->p + s->kpos, s->klen, key, sizeof key);
        return ect_set_error(ECT_EPROTO, "%s.%s: %s", s->msg, key, what);
    }
    return ect_set_error(ECT_EPROTO, "%s: %s", s->msg, what);
}

static int scan_need(const scanner *s, uint64_t n) {
    if (n > s->len - s->pos)
        return scan_fail(s,
                         "truncated input (%" PRIu64 " more bytes needed at offset %zu, %zu left)",
                         n, s->pos, s->len - s->pos);
    return 0;
}

/* Reads a big-endian unsigned of `width` bytes. */
static int scan_uint(scanner *s, unsigned width, uint64_t *v) {
    int rc = scan_need(s, width);
    if (rc) return rc;
    uint64_t x = 0;
    for (unsigned k = 0; k < width; k++) x = (x << 8) | s->p[s->pos++];
    *v = x;
    return 0;
}

static int scan_value(scanner *s, int depth);

static int scan_container(scanner *s, uint64_t n, bool is_map, int depth) {
    uint64_t objs = is_map ? 2 * n : n; /* n < 2^32, cannot overflow */
    if (objs > s->len - s->pos)
        return scan_fail(s,
                         "truncated input (%s at offset %zu declares %" PRIu64
                         " entries, only %zu bytes left)",
                         is_map ? "map" : "array", s->pos, n, s->len - s->pos);
    for (uint64_t k = 0; k < objs; k++) {
        int rc = scan_value(s, depth + 1);
        if (rc) return rc;
    }
    return 0;
}

static int scan_value(scanner *s, int depth) {
    if (depth > WIRE_PULL_MAX_DEPTH)
        return scan_fail(s, "nesting deeper than %d levels", WIRE_PULL_MAX_DEPTH);
    if (s->nobj >= WIRE_PULL_MAX_OBJECTS)
        return scan_fail(s, "more than %d msgpack objects in one message", WIRE_PULL_MAX_OBJECTS);
    s->nobj++;
    int rc = scan_need(s, 1);
    if (rc) return rc;
    uint8_t b = s->p[s->pos++];
    uint64_t n = 0, extra = 0;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) return 0;
    if ((b & 0xf0) == 0x80) return scan_container(s, b & 0x0f, true, depth);
    if ((b & 0xf0) == 0x90) return scan_container(s, b & 0x0f, false, depth);
    if ((b & 0xe0) == 0xa0) {
        rc = scan_need(s, b & 0x1f);
        if (!rc) s->pos += b & 0x1f;
        return rc;
    }
    switch (b) {
    case 0xc4: /* bin 8/16/32 */
    case 0xd9: /* str 8/16/32 */ rc = scan_uint(s, 1, &n); break;
    case 0xc5:
    case 0xda: rc = scan_uint(s, 2, &n); break;
    case 0xc6:
    case 0xdb: rc = scan_uint(s, 4, &n); break;
    case 0xc7: rc = scan_uint(s, 1, &n), extra = 1; break; /* ext 8/16/32: + type byte */
    case 0xc8: rc = scan_uint(s, 2, &n), extra = 1; break;
    case 0xc9: rc = scan_uint(s, 4, &n), extra = 1; break;
    case 0xca: n = 4; break; /* float 32 */
    case 0xcb: n = 8; break; /* float 64 */
    case 0xcc:
    case 0xd0: n = 1; break;
    case 0xcd:
    case 0xd1: n = 2; break;
    case 0xce:
    case 0xd2: n = 4; break;
    case 0xcf:
    case 0xd3: n = 8; break;
    case 0xd4: n = 2; break; /* fixext 1/2/4/8/16: type byte + data */
    case 0xd5: n = 3; break;
    case 0xd6: n = 5; break;
    case 0xd7: n = 9; break;
    case 0xd8: n = 17; break;
    case 0xdc: /* array 16/32, map 16/32 */
    case 0xdd:
    case 0xde:
    case 0xdf:
        rc = scan_uint(s, (b & 1) ? 4 : 2, &n);
        return rc ? rc : scan_container(s, n, b >= 0xde, depth);
    default: /* 0xc1, the one byte msgpack never uses */
        return scan_fail(s, "invalid msgpack byte 0x%02x at offset %zu", b, s->pos - 1);
    }
    if (rc) return rc;
    rc = scan_need(s, n + extra);
    if (rc) return rc;
    s->pos += (size_t)(n + extra);
    return 0;
}

/* Scans the whole input: one map with at most WIRE_PULL_MAX_KEYS keys and
 * nothing after it. The error text names the top-level key being read. */
static int scan_message(scanner *s) {
    if (s->len == 0) return scan_fail(s, "truncated input (empty message)");
    uint8_t b = s->p[0];
    uint64_t n;
    s->pos = 1;
    s->nobj = 1;
    int rc = 0;
    if ((b & 0xf0) == 0x80)
        n = b & 0x0f;
    else if (b == 0xde)
        rc = scan_uint(s, 2, &n);
    else if (b == 0xdf)
        rc = scan_uint(s, 4, &n);
    else
        return scan_fail(s, "expected a msgpack map at the top level (first byte 0x%02x)", b);
    if (rc) return rc;
    if (n > WIRE_PULL_MAX_KEYS)
        return scan_fail(s, "map of %" PRIu64 " keys exceeds the bound of %d", n,
                         WIRE_PULL_MAX_KEYS);
    for (uint64_t k = 0; k < n; k++) {
        size_t kpos = s->pos;
        s->klen = 0;
        rc = scan_value(s, 2);
        if (rc) return rc;
        /* Name the key in later errors when it is a str. */
        uint8_t kb = s->p[kpos];
        size_t hdr = (kb & 0xe0) == 0xa0 ? 1 : kb == 0xd9 ? 2 : kb == 0xda ? 3 : kb == 0xdb ? 5 : 0;
        if (hdr) {
            s->kpos = kpos + hdr;
            s->klen = s->pos - kpos - hdr;
        }
        rc = scan_value(s, 2);
        if (rc) return rc;
    }
    s->klen = 0;
    if (s->pos != s->len)
        return scan_fail(s, "%zu trailing bytes after the message", s->len - s->pos);
    return 0;
}

/* ------------------------------------------------ step 2: msgpack-c unpack */

#define UNPACK_ZONE_CHUNK 960 /* bytes: below malloc's large-request threshold with its header */

static int unpack(const void *buf, size_t len, const char *msg, msgpack_unpacked *u) {
    msgpack_unpacked_init(u);
    if (!buf && len) return ect_set_error(ECT_EINVAL, "%s: NULL buffer", msg);
    if (len > WIRE_PULL_MAX_MSG)
        return ect_set_error(ECT_EPROTO, "%s: message of %zu bytes exceeds the bound of %u bytes",
                             msg, len, WIRE_PULL_MAX_MSG);
    scanner s = {.p = buf, .len = len, .msg = msg};
    int rc = scan_message(&s);
    if (rc) return rc;
    /* The zone's first chunk sized for a message of ours (msgpack-c's default
     * is 8 KiB, a large malloc per message); a larger one grows it. */
    u->zone = msgpack_zone_new(UNPACK_ZONE_CHUNK);
    if (!u->zone)
        return ect_set_error(ECT_ENOMEM, "%s: out of memory unpacking %zu bytes", msg, len);
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack(buf, len, &off, u->zone, &u->data);
    if (r == MSGPACK_UNPACK_SUCCESS && off == len && u->data.type == MSGPACK_OBJECT_MAP) return 0;
    msgpack_unpacked_destroy(u);
    msgpack_unpacked_init(u);
    if (r == MSGPACK_UNPACK_NOMEM_ERROR)
        return ect_set_error(ECT_ENOMEM, "%s: out of memory unpacking %zu bytes", msg, len);
    /* The scan accepts exactly what msgpack-c parses; reaching here is a bug
     * on one side, reported rather than asserted since the bytes are remote. */
    return ect_set_error(ECT_EPROTO, "%s: msgpack-c could not parse the message (code %d)", msg,
                         (int)r);
}

/* ---------------------------------------------------- step 3: typed walk */

static bool key_is(const msgpack_object *k, const char *name) {
    size_t n = strlen(name);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
           memcmp(k->via.str.ptr, name, n) == 0;
}

static const msgpack_object *find_key(const msgpack_object *root, const char *name) {
    for (uint32_t i = 0; i < root->via.map.size; i++)
        if (key_is(&root->via.map.ptr[i].key, name)) return &root->via.map.ptr[i].val;
    return NULL;
}

/* Binds the top-level keys to `names` (vals[k] for names[k]); rejects
 * non-string and duplicate keys and missing fields; ignores unknown keys. */
static int bind_fields(const msgpack_object *root, const char *msg, const char *const *names,
                       size_t n, const msgpack_object **vals) {
    const msgpack_object_kv *kv = root->via.map.ptr;
    uint32_t size = root->via.map.size;
    for (size_t k = 0; k < n; k++) vals[k] = NULL;
    for (uint32_t i = 0; i < size; i++) {
        const msgpack_object *key = &kv[i].key;
        if (key->type != MSGPACK_OBJECT_STR)
            return ect_set_error(ECT_EPROTO, "%s: key #%u is a %s, keys must be str", msg, i,
                                 obj_type_name(key));
        for (uint32_t j = 0; j < i; j++) {
            /* (an empty str may have a NULL ptr: no memcmp for it) */
            if (kv[j].key.via.str.size == key->via.str.size &&
                (key->via.str.size == 0 ||
                 memcmp(kv[j].key.via.str.ptr, key->via.str.ptr, key->via.str.size) == 0)) {
                char name[64];
                printable(key->via.str.ptr, key->via.str.size, name, sizeof name);
                return ect_set_error(ECT_EPROTO, "%s.%s: duplicate key", msg, name);
            }
        }
        for (size_t k = 0; k < n; k++)
            if (key_is(key, names[k])) vals[k] = &kv[i].val;
    }
    for (size_t k = 0; k < n; k++)
        if (!vals[k]) return ect_set_error(ECT_EPROTO, "%s.%s: missing field", msg, names[k]);
    return 0;
}

static int get_u64(const msgpack_object *o, const fpath *f, uint64_t *out) {
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *out = o->via.u64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return ferr(f, ECT_EPROTO, "negative int %" PRId64 ", expected 0..2^64-1", o->via.i64);
    return ferr(f, ECT_EPROTO, "expected an int, got %s", obj_type_name(o));
}

static int get_i32(const msgpack_object *o, const fpath *f, int32_t *out) {
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > INT32_MAX)
            return ferr(f, ECT_EPROTO, "int %" PRIu64 " out of the int32 range", o->via.u64);
        *out = (int32_t)o->via.u64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        if (o->via.i64 < INT32_MIN)
            return ferr(f, ECT_EPROTO, "int %" PRId64 " out of the int32 range", o->via.i64);
        *out = (int32_t)o->via.i64;
        return 0;
    }
    return ferr(f, ECT_EPROTO, "expected an int, got %s", obj_type_name(o));
}

static int get_bool(const msgpack_object *o, const fpath *f, bool *out) {
    if (o->type != MSGPACK_OBJECT_BOOLEAN)
        return ferr(f, ECT_EPROTO, "expected a bool, got %s", obj_type_name(o));
    *out = o->via.boolean;
    return 0;
}

/* A str field of 1..max bytes, copied. */
static int get_text(const msgpack_object *o, const fpath *f, size_t max, char **out) {
    if (o->type != MSGPACK_OBJECT_STR)
        return ferr(f, ECT_EPROTO, "expected a str, got %s", obj_type_name(o));
    int rc = check_text(f, ECT_EPROTO, o->via.str.ptr, o->via.str.size, max);
    if (rc) return rc;
    char *s = malloc(o->via.str.size + 1);
    if (!s) return ferr(f, ECT_ENOMEM, "out of memory");
    memcpy(s, o->via.str.ptr, o->via.str.size);
    s[o->via.str.size] = '\0';
    *out = s;
    return 0;
}

static int get_str(const msgpack_object *o, const fpath *f, char **out) {
    return get_text(o, f, WIRE_PULL_MAX_STR, out);
}

static int get_list(const msgpack_object *o, const fpath *f, const msgpack_object **elems,
                    size_t *n) {
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return ferr(f, ECT_EPROTO, "expected an array, got %s", obj_type_name(o));
    if (o->via.array.size > WIRE_PULL_MAX_ITEMS)
        return ferr(f, ECT_EPROTO, "list of %u entries exceeds the bound of %d", o->via.array.size,
                    WIRE_PULL_MAX_ITEMS);
    *elems = o->via.array.ptr;
    *n = o->via.array.size;
    return 0;
}

static int get_dtype(const msgpack_object *o, const fpath *f, char out[WIRE_PULL_DTYPE_CAP]) {
    if (o->type != MSGPACK_OBJECT_STR)
        return ferr(f, ECT_EPROTO, "expected a str, got %s", obj_type_name(o));
    int rc = check_text(f, ECT_EPROTO, o->via.str.ptr, o->via.str.size, WIRE_PULL_DTYPE_CAP - 1);
    if (rc) return rc;
    memcpy(out, o->via.str.ptr, o->via.str.size);
    out[o->via.str.size] = '\0';
    if (!wire_dtype_canonical(out))
        return ferr(f, ECT_EPROTO, "Unsupported torch dtype string '%s'", out);
    return 0;
}

static void items_free(wire_pull_item *items, size_t n) {
    if (!items) return;
    for (size_t i = 0; i < n; i++) free(items[i].mm_hash);
    free(items);
}

/* The four columnar lists -> rows. vals[0..3] are mm_hashes, shapes,
 * dtype_strs, num_bytes_list. */
static int items_from_obj(const msgpack_object *const *vals, const char *msg, wire_pull_item **out,
                          size_t *out_n) {
    static const char *const names[4] = {"mm_hashes", "shapes", "dtype_strs", "num_bytes_list"};
    const msgpack_object *col[4];
    size_t n[4];
    for (int c = 0; c < 4; c++) {
        fpath f = {msg, names[c], -1, -1};
        int rc = get_list(vals[c], &f, &col[c], &n[c]);
        if (rc) return rc;
    }
    for (int c = 1; c < 4; c++)
        if (n[c] != n[0])
            return ect_set_error(ECT_EPROTO, "%s.%s: list has %zu entries but mm_hashes has %zu",
                                 msg, names[c], n[c], n[0]);
    wire_pull_item *items = n[0] ? calloc(n[0], sizeof *items) : NULL;
    if (n[0] && !items) return ect_set_error(ECT_ENOMEM, "%s: out of memory", msg);
    int rc = 0;
    for (size_t i = 0; i < n[0] && !rc; i++) {
        wire_pull_item *it = &items[i];
        fpath fh = {msg, "mm_hashes", (long)i, -1};
        rc = get_str(&col[0][i], &fh, &it->mm_hash);
        if (rc) break;
        fpath fs = {msg, "shapes", (long)i, -1};
        const msgpack_object *dims = &col[1][i];
        if (dims->type != MSGPACK_OBJECT_ARRAY) {
            rc = ferr(&fs, ECT_EPROTO, "expected an array, got %s", obj_type_name(dims));
            break;
        }
        if (dims->via.array.size > WIRE_MAX_NDIM) {
            rc = ferr(&fs, ECT_EPROTO, "shape has %u dimensions, at most %d allowed",
                      dims->via.array.size, WIRE_MAX_NDIM);
            break;
        }
        it->ndim = dims->via.array.size;
        for (uint32_t d = 0; d < it->ndim && !rc; d++) {
            fpath fd = {msg, "shapes", (long)i, (long)d};
            rc = get_u64(&dims->via.array.ptr[d], &fd, &it->shape[d]);
        }
        if (rc) break;
        fpath ft = {msg, "dtype_strs", (long)i, -1};
        rc = get_dtype(&col[2][i], &ft, it->dtype);
        if (rc) break;
        fpath fb = {msg, "num_bytes_list", (long)i, -1};
        rc = get_u64(&col[3][i], &fb, &it->num_bytes);
        if (rc) break;
        char where[160];
        fpath_str(&fb, where, sizeof where);
        if (wire_check_nbytes(it->dtype, it->shape, it->ndim, it->num_bytes, where))
            rc = retag_error(ECT_EPROTO);
    }
    if (rc) {
        items_free(items, n[0]);
        return rc;
    }
    *out = items;
    *out_n = n[0];
    return 0;
}

static int notification_from_obj(const msgpack_object *root, wire_hash_notification *m) {
    const char *msg = "ECHashNotification";
    const msgpack_object *v[MAX_FIELDS];
    int rc = bind_fields(root, msg, notif_keys, ECT_ARRAY_LEN(notif_keys), v);
    if (!rc) rc = items_from_obj(v, msg, &m->items, &m->n_items);
    if (!rc)
        rc = get_str(v[4], &(fpath){msg, "producer_session_id", -1, -1}, &m->producer_session_id);
    if (rc) wire_hash_notification_free(m);
    return rc;
}

/* The extension keys present in a message whose upstream fields decoded
 * (dst_key and error only where the message has them: non-NULL pointers).
 * A malformed one leaves every extension absent and says why in *ext_error;
 * only ECT_ENOMEM fails. */
/* The optional "ect_shm_id" of ECTransferComplete: 16 lowercase hex digits, not all 0. */
static int get_shm_id(const msgpack_object *v, const char *msg, uint64_t *id) {
    if (v->type == MSGPACK_OBJECT_STR && wctl_shm_id_parse(v->via.str.ptr, v->via.str.size, id))
        return 0;
    *id = 0;
    return ect_set_error(ECT_EINVAL, "%s: ect_shm_id: expected 16 lowercase hex digits, not all 0",
                         msg);
}

/* The optional "ect_batch" of ECTransferComplete: 2..WIRE_PULL_MAX_ITEMS. */
static int get_batch_max(const msgpack_object *v, const char *msg, uint32_t *n) {
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 >= 2 &&
        v->via.u64 <= WIRE_PULL_MAX_ITEMS) {
        *n = (uint32_t)v->via.u64;
        return 0;
    }
    *n = 0;
    return ect_set_error(ECT_EINVAL, "%s: ect_batch: expected an int 2..%d", msg,
                         WIRE_PULL_MAX_ITEMS);
}

static int ext_from_obj(const msgpack_object *root, const char *msg, char **dst_key,
                        bool *has_token, uint64_t *token, char **error, uint64_t *shm_id,
                        uint32_t *batch_max, char **ext_error) {
    const msgpack_object *v;
    int rc = 0;
    if (dst_key && (v = find_key(root, "dst_key")))
        rc = get_text(v, &(fpath){msg, "dst_key", -1, -1}, WIRE_PULL_MAX_KEY, dst_key);
    if (!rc && (v = find_key(root, "token")))
        *has_token = (rc = get_u64(v, &(fpath){msg, "token", -1, -1}, token)) == 0;
    if (!rc && error && (v = find_key(root, "error")))
        rc = get_str(v, &(fpath){msg, "error", -1, -1}, error);
    if (!rc && shm_id && (v = find_key(root, "ect_shm_id"))) rc = get_shm_id(v, msg, shm_id);
    if (!rc && batch_max && (v = find_key(root, "ect_batch")))
        rc = get_batch_max(v, msg, batch_max);
    if (rc == 0 || rc == ECT_ENOMEM) return rc;
    if (shm_id) *shm_id = 0;
    if (batch_max) *batch_max = 0;
    if (dst_key) {
        free(*dst_key);
        *dst_key = NULL;
    }
    if (error) {
        free(*error);
        *error = NULL;
    }
    *has_token = false;
    *token = 0;
    if (!(*ext_error = strdup(ect_last_error())))
        return ect_set_error(ECT_ENOMEM, "%s: out of memory", msg);
    return 0;
}

static int pull_from_obj(const msgpack_object *root, wire_transfer_pull *m) {
    const char *msg = "ECTransferPull";
    const msgpack_object *v[MAX_FIELDS];
    int rc = bind_fields(root, msg, pull_keys, ECT_ARRAY_LEN(pull_keys), v);
    if (!rc) rc = get_str(v[0], &(fpath){msg, "mm_hash", -1, -1}, &m->mm_hash);
    if (!rc) rc = get_u64(v[1], &(fpath){msg, "dst_ptr", -1, -1}, &m->dst_ptr);
    if (!rc) rc = get_u64(v[2], &(fpath){msg, "dst_offset", -1, -1}, &m->dst_offset);
    if (!rc)
        rc = get_str(v[3], &(fpath){msg, "consumer_session_id", -1, -1}, &m->consumer_session_id);
    if (!rc)
        rc = ext_from_obj(root, msg, &m->dst_key, &m->has_token, &m->token, NULL, NULL, NULL,
                          &m->ext_error);
    if (rc) wire_transfer_pull_free(m);
    return rc;
}

static int complete_from_obj(const msgpack_object *root, wire_transfer_complete *m) {
    const char *msg = "ECTransferComplete";
    const msgpack_object *v[MAX_FIELDS];
    int rc = bind_fields(root, msg, complete_keys, ECT_ARRAY_LEN(complete_keys), v);
    if (!rc) rc = get_str(v[0], &(fpath){msg, "mm_hash", -1, -1}, &m->mm_hash);
    if (!rc) rc = get_i32(v[1], &(fpath){msg, "status", -1, -1}, &m->status);
    if (!rc)
        rc = ext_from_obj(root, msg, NULL, &m->has_token, &m->token, &m->error, &m->shm_id,
                          &m->batch_max, &m->ext_error);
    if (rc) wire_transfer_complete_free(m);
    return rc;
}

static int request_from_obj(const msgpack_object *root, wire_transfer_request *m) {
    const char *msg = "ECTransferRequest";
    const msgpack_object *v[MAX_FIELDS];
    int rc = bind_fields(root, msg, request_keys, ECT_ARRAY_LEN(request_keys), v);
    if (!rc) rc = get_str(v[0], &(fpath){msg, "request_id", -1, -1}, &m->request_id);
    if (!rc)
        rc = get_str(v[1], &(fpath){msg, "consumer_session_id", -1, -1}, &m->consumer_session_id);
    const msgpack_object *elems = NULL;
    size_t n = 0;
    if (!rc) rc = get_list(v[2], &(fpath){msg, "mm_hashes", -1, -1}, &elems, &n);
    if (!rc && n) {
        m->mm_hashes = calloc(n, sizeof *m->mm_hashes);
        if (!m->mm_hashes) rc = ect_set_error(ECT_ENOMEM, "%s: out of memory", msg);
    }
    for (size_t i = 0; i < n && !rc; i++) {
        rc = get_str(&elems[i], &(fpath){msg, "mm_hashes", (long)i, -1}, &m->mm_hashes[i]);
        m->n_mm_hashes = i + 1; /* so _free releases what was copied */
    }
    if (rc) wire_transfer_request_free(m);
    return rc;
}

static int ready_from_obj(const msgpack_object *root, wire_transfer_ready *m) {
    const char *msg = "ECTransferReady";
    const msgpack_object *v[MAX_FIELDS];
    int rc = bind_fields(root, msg, ready_keys, ECT_ARRAY_LEN(ready_keys), v);
    if (!rc) rc = get_str(v[0], &(fpath){msg, "request_id", -1, -1}, &m->request_id);
    if (!rc) rc = items_from_obj(v + 1, msg, &m->items, &m->n_items);
    if (!rc)
        rc = get_str(v[5], &(fpath){msg, "producer_session_id", -1, -1}, &m->producer_session_id);
    if (!rc) rc = get_bool(v[6], &(fpath){msg, "more", -1, -1}, &m->more);
    if (rc) wire_transfer_ready_free(m);
    return rc;
}

/* ECTransferPullBatch entries: [mm_hash, dst_offset, token, dst_key]. */
#define BATCH_ENTRY_LEN 4

static int batch_entry_from_obj(const msgpack_object *e, long i, uint64_t dst_ptr,
                                const char *session, wire_transfer_pull *p) {
    const char *msg = "ECTransferPullBatch";
    if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != BATCH_ENTRY_LEN)
        return ferr(&(fpath){msg, "ect_pulls", i, -1}, ECT_EPROTO,
                    "expected an array of %d, got %s", BATCH_ENTRY_LEN, obj_type_name(e));
    const msgpack_object *f = e->via.array.ptr;
    p->dst_ptr = dst_ptr;
    p->has_token = true;
    int rc = get_str(&f[0], &(fpath){msg, "ect_pulls", i, 0}, &p->mm_hash);
    if (!rc) rc = get_u64(&f[1], &(fpath){msg, "ect_pulls", i, 1}, &p->dst_offset);
    if (!rc) rc = get_u64(&f[2], &(fpath){msg, "ect_pulls", i, 2}, &p->token);
    if (!rc) rc = get_text(&f[3], &(fpath){msg, "ect_pulls", i, 3}, WIRE_PULL_MAX_KEY, &p->dst_key);
    if (!rc && !(p->consumer_session_id = strdup(session)))
        rc = ect_set_error(ECT_ENOMEM, "%s: out of memory", msg);
    return rc;
}

static const char *const batch_keys[] = {"ect_pulls", "ect_dst_ptr", "consumer_session_id"};

static int batch_from_obj(const msgpack_object *root, wire_transfer_pull_batch *m) {
    const char *msg = "ECTransferPullBatch";
    const msgpack_object *v[MAX_FIELDS], *elems = NULL;
    size_t n = 0;
    uint64_t dst_ptr = 0;
    char *session = NULL;
    int rc = bind_fields(root, msg, batch_keys, ECT_ARRAY_LEN(batch_keys), v);
    if (!rc) rc = get_list(v[0], &(fpath){msg, "ect_pulls", -1, -1}, &elems, &n);
    if (!rc && n == 0) rc = ferr(&(fpath){msg, "ect_pulls", -1, -1}, ECT_EPROTO, "empty list");
    if (!rc) rc = get_u64(v[1], &(fpath){msg, "ect_dst_ptr", -1, -1}, &dst_ptr);
    if (!rc) rc = get_str(v[2], &(fpath){msg, "consumer_session_id", -1, -1}, &session);
    if (!rc && !(m->pulls = calloc(n, sizeof *m->pulls)))
        rc = ect_set_error(ECT_ENOMEM, "%s: out of memory", msg);
    for (size_t i = 0; i < n && !rc; i++) {
        m->n = i + 1; /* so _free releases what was copied */
        rc = batch_entry_from_obj(&elems[i], (long)i, dst_ptr, session, &m->pulls[i]);
    }
    free(session);
    if (rc) wire_transfer_pull_batch_free(m);
    return rc;
}

static int done_from_obj(const msgpack_object *root, wire_transfer_done *m) {
    const char *msg = "ECTransferDone";
    const msgpack_object *v[MAX_FIELDS], *elems = NULL;
    size_t n = 0;
    static const char *const done_keys[] = {"ect_done"};
    int rc = bind_fields(root, msg, done_keys, 1, v);
    if (!rc) rc = get_list(v[0], &(fpath){msg, "ect_done", -1, -1}, &elems, &n);
    if (!rc && n == 0) rc = ferr(&(fpath){msg, "ect_done", -1, -1}, ECT_EPROTO, "empty list");
    if (!rc && !(m->tokens = calloc(n, sizeof *m->tokens)))
        rc = ect_set_error(ECT_ENOMEM, "%s: out of memory", msg);
    for (size_t i = 0; i < n && !rc; i++) {
        m->n = i + 1;
        rc = get_u64(&elems[i], &(fpath){msg, "ect_done", (long)i, -1}, &m->tokens[i]);
    }
    if (rc) wire_transfer_done_free(m);
    return rc;
}

/* ------------------------------------- the per-pull messages, fast path */

/* ECTransferPull and ECTransferComplete arrive once per pull: a message of
 * the shape every sender of them uses (a fixmap of fixstr keys, each one
 * of that message's fields at most once, values in the usual forms, texts
 * valid) is decoded here in one pass over the bytes, without msgpack-c's
 * object tree; anything else (another key, a duplicate, another form of a
 * value, a text or field the decoder would refuse) goes to the general
 * decoder, which gives the result or the error. So this path only ever
 * accepts what the general one accepts, with the same result
 * (wire_pull_decode_general; fuzz_pull_msg compares the two). */

enum { F_HASH, F_PTR, F_OFF, F_SESS, F_KEY, F_TOKEN, F_STATUS, F_ERROR, F_SHM, F_BATCH, F_N };
static const char *const fast_names[F_N] = {
    "mm_hash", "dst_ptr", "dst_offset", "consumer_session_id", "dst_key",
    "token",   "status",  "error",      "ect_shm_id",          "ect_batch"};
#define PULL_FIELDS (1u << F_HASH | 1u << F_PTR | 1u << F_OFF | 1u << F_SESS)
#define PULL_ALLOWED (PULL_FIELDS | 1u << F_KEY | 1u << F_TOKEN)
#define COMPLETE_FIELDS (1u << F_HASH | 1u << F_STATUS)
#define COMPLETE_ALLOWED                                                                           \
    (COMPLETE_FIELDS | 1u << F_TOKEN | 1u << F_ERROR | 1u << F_SHM | 1u << F_BATCH)

typedef struct fast_in {
    const uint8_t *p, *end;
} fast_in;

/* v, the big-endian unsigned of width bytes at in->p; false past the end. */
static bool fast_be(fast_in *in, unsigned width, uint64_t *v) {
    if ((size_t)(in->end - in->p) < width) return false;
    uint64_t x = 0;
    for (unsigned k = 0; k < width; k++) x = (x << 8) | *in->p++;
    *v = x;
    return true;
}

/* A str (fixstr, str8, str16): its bytes. */
static bool fast_str(fast_in *in, const char **s, size_t *n) {
    if (in->p == in->end) return false;
    uint8_t b = *in->p++;
    uint64_t len;
    if ((b & 0xe0) == 0xa0)
        len = b & 0x1f;
    else if (!((b == 0xd9 && fast_be(in, 1, &len)) || (b == 0xda && fast_be(in, 2, &len))))
        return false;
    if ((uint64_t)(in->end - in->p) < len) return false;
    *s = (const char *)in->p;
    *n = (size_t)len;
    in->p += len;
    return true;
}

/* An unsigned (positive fixint, uint8..64), as msgpack-c reads it. */
static bool fast_uint(fast_in *in, uint64_t *v) {
    if (in->p == in->end) return false;
    uint8_t b = *in->p++;
    if (b <= 0x7f) {
        *v = b;
        return true;
    }
    return b >= 0xcc && b <= 0xcf && fast_be(in, 1u << (b - 0xcc), v);
}

/* An int32 (fixint either sign, uint8..32 up to INT32_MAX, int8..32). */
static bool fast_i32(fast_in *in, int32_t *v) {
    if (in->p == in->end) return false;
    uint8_t b = *in->p;
    uint64_t x;
    if (b >= 0xe0) {
        in->p++;
        *v = (int8_t)b;
        return true;
    }
    if (b >= 0xd0 && b <= 0xd2) {
        in->p++;
        unsigned w = 1u << (b - 0xd0);
        if (!fast_be(in, w, &x)) return false;
        *v = w == 1 ? (int8_t)x : w == 2 ? (int16_t)x : (int32_t)(uint32_t)x;
        return true;
    }
    if (b == 0xcf || !fast_uint(in, &x) || x > INT32_MAX) return false;
    *v = (int32_t)x;
    return true;
}

static bool text_ok(const char *s, size_t n, size_t max) {
    return n && n <= max && !memchr(s, '\0', n) && utf8_valid((const unsigned char *)s, n);
}

static char *text_dup(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* The fields of one fast-path message. */
typedef struct fast_msg {
    unsigned seen;
    const char *str[F_N];
    size_t len[F_N];
    uint64_t u[F_N];
    int32_t status;
} fast_msg;

/* Reads the whole message into f; false when it is not of the fast shape. */
static bool fast_scan(const void *buf, size_t len, fast_msg *f) {
    fast_in in = {buf, (const uint8_t *)buf + len};
    if (!buf || len == 0 || len > WIRE_PULL_MAX_MSG || (*in.p & 0xf0) != 0x80) return false;
    unsigned n = *in.p++ & 0x0f;
    f->seen = 0;
    for (unsigned k = 0; k < n; k++) {
        const char *key;
        size_t kl;
        if (in.p == in.end || (*in.p & 0xe0) != 0xa0 || !fast_str(&in, &key, &kl)) return false;
        int id = 0;
        while (id < F_N && !(strlen(fast_names[id]) == kl && !memcmp(fast_names[id], key, kl)))
            id++;
        if (id == F_N || (f->seen & 1u << id)) return false;
        f->seen |= 1u << id;
        bool ok;
        switch (id) {
        case F_PTR:
        case F_OFF:
        case F_TOKEN: ok = fast_uint(&in, &f->u[id]); break;
        case F_BATCH: /* out of range: the general decoder says why */
            ok = fast_uint(&in, &f->u[id]) && f->u[id] >= 2 && f->u[id] <= WIRE_PULL_MAX_ITEMS;
            break;
        case F_STATUS: ok = fast_i32(&in, &f->status); break;
        case F_SHM: /* a bad one: the general decoder says why */
            ok = fast_str(&in, &f->str[id], &f->len[id]) &&
                 wctl_shm_id_parse(f->str[id], f->len[id], &f->u[id]);
            break;
        default:
            ok = fast_str(&in, &f->str[id], &f->len[id]) &&
                 text_ok(f->str[id], f->len[id],
                         id == F_KEY ? WIRE_PULL_MAX_KEY : WIRE_PULL_MAX_STR);
        }
        if (!ok) return false;
    }
    return in.p == in.end;
}

static bool fast_pull(const fast_msg *f, wire_transfer_pull *m) {
    memset(m, 0, sizeof *m);
    m->mm_hash = text_dup(f->str[F_HASH], f->len[F_HASH]);
    m->consumer_session_id = text_dup(f->str[F_SESS], f->len[F_SESS]);
    if (f->seen & 1u << F_KEY) m->dst_key = text_dup(f->str[F_KEY], f->len[F_KEY]);
    if (!m->mm_hash || !m->consumer_session_id || (!m->dst_key && (f->seen & 1u << F_KEY))) {
        wire_transfer_pull_free(m);
        return false; /* out of memory: the general decoder says so */
    }
    m->dst_ptr = f->u[F_PTR];
    m->dst_offset = f->u[F_OFF];
    m->has_token = f->seen & 1u << F_TOKEN;
    m->token = m->has_token ? f->u[F_TOKEN] : 0;
    return true;
}

static bool fast_complete(const fast_msg *f, wire_transfer_complete *m) {
    memset(m, 0, sizeof *m);
    m->mm_hash = text_dup(f->str[F_HASH], f->len[F_HASH]);
    if (f->seen & 1u << F_ERROR) m->error = text_dup(f->str[F_ERROR], f->len[F_ERROR]);
    if (!m->mm_hash || (!m->error && (f->seen & 1u << F_ERROR))) {
        wire_transfer_complete_free(m);
        return false;
    }
    m->status = f->status;
    m->has_token = f->seen & 1u << F_TOKEN;
    m->token = m->has_token ? f->u[F_TOKEN] : 0;
    m->shm_id = f->seen & 1u << F_SHM ? f->u[F_SHM] : 0;
    m->batch_max = f->seen & 1u << F_BATCH ? (uint32_t)f->u[F_BATCH] : 0;
    return true;
}

/* The type the fast path decodes buf as (by decode_any's key rule, among
 * its own fields only), or WIRE_PULL_NONE. */
static wire_pull_type fast_type(const fast_msg *f) {
    if ((f->seen & 1u << F_PTR) && (f->seen & ~PULL_ALLOWED) == 0 &&
        (f->seen & PULL_FIELDS) == PULL_FIELDS)
        return WIRE_PULL_PULL;
    if (!(f->seen & 1u << F_PTR) && (f->seen & ~COMPLETE_ALLOWED) == 0 &&
        (f->seen & COMPLETE_FIELDS) == COMPLETE_FIELDS)
        return WIRE_PULL_COMPLETE;
    return WIRE_PULL_NONE;
}

/* Decodes buf through the fast path into out: true, or false (nothing
 * left in out) for the general decoder. */
/* An array header (fixarray, array16) of 1..WIRE_PULL_MAX_ITEMS entries. */
static bool fast_array(fast_in *in, size_t *n) {
    if (in->p == in->end) return false;
    uint8_t b = *in->p++;
    uint64_t v;
    if ((b & 0xf0) == 0x90)
        v = b & 0x0f;
    else if (!(b == 0xdc && fast_be(in, 2, &v)))
        return false;
    *n = (size_t)v;
    return v >= 1 && v <= WIRE_PULL_MAX_ITEMS;
}

/* The literal key k (a fixstr) next in `in`. */
static bool fast_key(fast_in *in, const char *k) {
    const char *s;
    size_t n;
    return fast_str(in, &s, &n) && n == strlen(k) && memcmp(s, k, n) == 0;
}

/* A text of 1..max bytes, copied; false (nothing left) otherwise. */
static bool fast_text(fast_in *in, size_t max, char **out) {
    const char *s;
    size_t n;
    return fast_str(in, &s, &n) && text_ok(s, n, max) && (*out = text_dup(s, n)) != NULL;
}

/* ECTransferPullBatch as our encoder lays it out: {"ect_pulls": [[mm_hash,
 * dst_offset, token, dst_key], ...], "ect_dst_ptr": u, "consumer_session_id":
 * s}. Anything else: false, for the general decoder. */
static bool fast_batch(fast_in *in, wire_transfer_pull_batch *m) {
    size_t n;
    if (!fast_key(in, "ect_pulls") || !fast_array(in, &n)) return false;
    if (!(m->pulls = calloc(n, sizeof *m->pulls))) return false;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        wire_transfer_pull *p = &m->pulls[i];
        m->n = i + 1;
        p->has_token = true;
        ok = in->p < in->end && *in->p++ == 0x90 + BATCH_ENTRY_LEN &&
             fast_text(in, WIRE_PULL_MAX_STR, &p->mm_hash) && fast_uint(in, &p->dst_offset) &&
             fast_uint(in, &p->token) && fast_text(in, WIRE_PULL_MAX_KEY, &p->dst_key);
    }
    uint64_t dst_ptr = 0;
    char *session = NULL;
    ok = ok && fast_key(in, "ect_dst_ptr") && fast_uint(in, &dst_ptr) &&
         fast_key(in, "consumer_session_id") && fast_text(in, WIRE_PULL_MAX_STR, &session) &&
         in->p == in->end;
    for (size_t i = 0; i < n && ok; i++) {
        m->pulls[i].dst_ptr = dst_ptr;
        ok = (m->pulls[i].consumer_session_id = strdup(session)) != NULL;
    }
    free(session);
    if (!ok) wire_transfer_pull_batch_free(m);
    return ok;
}

/* ECTransferDone: {"ect_done": [token, ...]}. */
static bool fast_done(fast_in *in, wire_transfer_done *m) {
    size_t n;
    if (!fast_key(in, "ect_done") || !fast_array(in, &n)) return false;
    if (!(m->tokens = malloc(n * sizeof *m->tokens))) return false;
    m->n = n;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) ok = fast_uint(in, &m->tokens[i]);
    if (!ok || in->p != in->end) {
        wire_transfer_done_free(m);
        return false;
    }
    return true;
}

static bool fast_decode(const void *buf, size_t len, wire_pull_msg *out) {
    fast_in in = {buf, (const uint8_t *)buf + len};
    if (buf && len >= 2 && len <= WIRE_PULL_MAX_MSG && in.p[0] == 0x83 && in.p[1] == 0xa9) {
        in.p++;
        out->type = WIRE_PULL_PULL_BATCH;
        return fast_batch(&in, &out->u.batch);
    }
    if (buf && len >= 2 && len <= WIRE_PULL_MAX_MSG && in.p[0] == 0x81 && in.p[1] == 0xa8) {
        in.p++;
        out->type = WIRE_PULL_DONE;
        return fast_done(&in, &out->u.done);
    }
    fast_msg f;
    if (!fast_scan(buf, len, &f)) return false;
    out->type = fast_type(&f);
    if (out->type == WIRE_PULL_PULL) return fast_pull(&f, &out->u.pull);
    if (out->type == WIRE_PULL_COMPLETE) return fast_complete(&f, &out->u.complete);
    return false;
}

/* ---------------------------------------------------------------- decode */

#define DEFINE_DECODE(fn, type, msgname, from_obj)                                                 \
    int fn(const void *buf, size_t len, type *out) {                                               \
        memset(out, 0, sizeof *out);                                                               \
        msgpack_unpacked u;                                                                        \
        int rc = unpack(buf, len, msgname, &u);                                                    \
        if (!rc) rc = from_obj(&u.data, out);                                                      \
        msgpack_unpacked_destroy(&u);                                                              \
        return rc;                                                                                 \
    }

DEFINE_DECODE(wire_hash_notification_decode, wire_hash_notification, "ECHashNotification",
              notification_from_obj)
static DEFINE_DECODE(pull_decode_general, wire_transfer_pull, "ECTransferPull",
                     pull_from_obj) static DEFINE_DECODE(complete_decode_general,
                                                         wire_transfer_complete,
                                                         "ECTransferComplete", complete_from_obj)

    int wire_transfer_pull_decode(const void *buf, size_t len, wire_transfer_pull *out) {
    wire_pull_msg m = {0};
    if (fast_decode(buf, len, &m) && m.type == WIRE_PULL_PULL) {
        *out = m.u.pull;
        return 0;
    }
    wire_pull_msg_free(&m);
    return pull_decode_general(buf, len, out);
}

int wire_transfer_complete_decode(const void *buf, size_t len, wire_transfer_complete *out) {
    wire_pull_msg m = {0};
    if (fast_decode(buf, len, &m) && m.type == WIRE_PULL_COMPLETE) {
        *out = m.u.complete;
        return 0;
    }
    wire_pull_msg_free(&m);
    return complete_decode_general(buf, len, out);
}
DEFINE_DECODE(wire_transfer_request_decode, wire_transfer_request, "ECTransferRequest",
              request_from_obj)
DEFINE_DECODE(wire_transfer_ready_decode, wire_transfer_ready, "ECTransferReady", ready_from_obj)
DEFINE_DECODE(wire_transfer_pull_batch_decode, wire_transfer_pull_batch, "ECTransferPullBatch",
              batch_from_obj)
DEFINE_DECODE(wire_transfer_done_decode, wire_transfer_done, "ECTransferDone", done_from_obj)

int wire_pull_decode_general(const void *buf, size_t len, wire_pull_msg *out) {
    memset(out, 0, sizeof *out);
    msgpack_unpacked u;
    int rc = unpack(buf, len, "pull message", &u);
    if (rc) return rc;
    const msgpack_object *root = &u.data;
    wire_pull_type t = WIRE_PULL_NONE;
    if (find_key(root, "ect_pulls"))
        t = WIRE_PULL_PULL_BATCH;
    else if (find_key(root, "ect_done"))
        t = WIRE_PULL_DONE;
    else if (find_key(root, "dst_ptr"))
        t = WIRE_PULL_PULL;
    else if (find_key(root, "status"))
        t = WIRE_PULL_COMPLETE;
    else if (find_key(root, "request_id"))
        t = find_key(root, "producer_session_id") ? WIRE_PULL_READY : WIRE_PULL_REQUEST;
    else if (find_key(root, "producer_session_id"))
        t = WIRE_PULL_NOTIFICATION;
    switch (t) {
    case WIRE_PULL_PULL: rc = pull_from_obj(root, &out->u.pull); break;
    case WIRE_PULL_COMPLETE: rc = complete_from_obj(root, &out->u.complete); break;
    case WIRE_PULL_READY: rc = ready_from_obj(root, &out->u.ready); break;
    case WIRE_PULL_REQUEST: rc = request_from_obj(root, &out->u.request); break;
    case WIRE_PULL_NOTIFICATION: rc = notification_from_obj(root, &out->u.notification); break;
    case WIRE_PULL_PULL_BATCH: rc = batch_from_obj(root, &out->u.batch); break;
    case WIRE_PULL_DONE: rc = done_from_obj(root, &out->u.done); break;
    default:
        rc = ect_set_error(ECT_EPROTO,
                           "pull message: unknown message type (none of the keys dst_ptr, "
                           "status, request_id, producer_session_id)");
    }
    msgpack_unpacked_destroy(&u);
    if (!rc)
        out->type = t;
    else
        memset(out, 0, sizeof *out);
    return rc;
}

int wire_pull_decode_any(const void *buf, size_t len, wire_pull_msg *out) {
    memset(out, 0, sizeof *out);
    if (fast_decode(buf, len, out)) return 0;
    wire_pull_msg_free(out);
    return wire_pull_decode_general(buf, len, out);
}

/* ------------------------------------------------------------------ free */

void wire_hash_notification_free(wire_hash_notification *m) {
    if (!m) return;
    items_free(m->items, m->n_items);
    free(m->producer_session_id);
    memset(m, 0, sizeof *m);
}

void wire_transfer_pull_free(wire_transfer_pull *m) {
    if (!m) return;
    free(m->mm_hash);
    free(m->consumer_session_id);
    free(m->dst_key);
    free(m->ext_error);
    memset(m, 0, sizeof *m);
}

void wire_transfer_complete_free(wire_transfer_complete *m) {
    if (!m) return;
    free(m->mm_hash);
    free(m->error);
    free(m->ext_error);
    memset(m, 0, sizeof *m);
}

void wire_transfer_request_free(wire_transfer_request *m) {
    if (!m) return;
    free(m->request_id);
    free(m->consumer_session_id);
    if (m->mm_hashes)
        for (size_t i = 0; i < m->n_mm_hashes; i++) free(m->mm_hashes[i]);
    free(m->mm_hashes);
    memset(m, 0, sizeof *m);
}

void wire_transfer_ready_free(wire_transfer_ready *m) {
    if (!m) return;
    free(m->request_id);
    items_free(m->items, m->n_items);
    free(m->producer_session_id);
    memset(m, 0, sizeof *m);
}

void wire_transfer_pull_batch_free(wire_transfer_pull_batch *m) {
    if (!m) return;
    if (m->pulls)
        for (size_t i = 0; i < m->n; i++) wire_transfer_pull_free(&m->pulls[i]);
    free(m->pulls);
    memset(m, 0, sizeof *m);
}

void wire_transfer_done_free(wire_transfer_done *m) {
    if (!m) return;
    free(m->tokens);
    memset(m, 0, sizeof *m);
}

void wire_pull_msg_free(wire_pull_msg *m) {
    if (!m) return;
    switch (m->type) {
    case WIRE_PULL_NOTIFICATION: wire_hash_notification_free(&m->u.notification); break;
    case WIRE_PULL_PULL: wire_transfer_pull_free(&m->u.pull); break;
    case WIRE_PULL_COMPLETE: wire_transfer_complete_free(&m->u.complete); break;
    case WIRE_PULL_REQUEST: wire_transfer_request_free(&m->u.request); break;
    case WIRE_PULL_READY: wire_transfer_ready_free(&m->u.ready); break;
    case WIRE_PULL_PULL_BATCH: wire_transfer_pull_batch_free(&m->u.batch); break;
    case WIRE_PULL_DONE: wire_transfer_done_free(&m->u.done); break;
    default: break;
    }
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------ encode-side validation */

static int check_cstr(const char *s, const fpath *f) {
    if (!s) return ferr(f, ECT_EINVAL, "is NULL");
    return check_text(f, ECT_EINVAL, s, strlen(s), WIRE_PULL_MAX_STR);
}

static int check_items(const wire_pull_item *items, size_t n, const char *msg) {
    if (n > WIRE_PULL_MAX_ITEMS)
        return ferr(&(fpath){msg, "mm_hashes", -1, -1}, ECT_EINVAL,
                    "list of %zu entries exceeds the bound of %d", n, WIRE_PULL_MAX_ITEMS);
    if (n && !items) return ferr(&(fpath){msg, "mm_hashes", -1, -1}, ECT_EINVAL, "items is NULL");
    for (size_t i = 0; i < n; i++) {
        const wire_pull_item *it = &items[i];
        int rc = check_cstr(it->mm_hash, &(fpath){msg, "mm_hashes", (long)i, -1});
        if (rc) return rc;
        if (it->ndim > WIRE_MAX_NDIM)
            return ferr(&(fpath){msg, "shapes", (long)i, -1}, ECT_EINVAL,
                        "shape has %u dimensions, at most %d allowed", it->ndim, WIRE_MAX_NDIM);
        fpath ft = {msg, "dtype_strs", (long)i, -1};
        size_t dl = strnlen(it->dtype, WIRE_PULL_DTYPE_CAP);
        if (dl == WIRE_PULL_DTYPE_CAP) return ferr(&ft, ECT_EINVAL, "is not NUL-terminated");
        if (!wire_dtype_canonical(it->dtype))
            return ferr(&ft, ECT_EINVAL, "Unsupported torch dtype string '%s'", it->dtype);
        char where[160];
        fpath_str(&(fpath){msg, "num_bytes_list", (long)i, -1}, where, sizeof where);
        if (wire_check_nbytes(it->dtype, it->shape, it->ndim, it->num_bytes, where))
            return retag_error(ECT_EINVAL);
    }
    return 0;
}

/* ---------------------------------------------------------------- encode */

/* Packing fails only when msgpack_sbuffer cannot grow; every pack call's
 * result is OR-ed into one flag checked at the end. */
static int pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    return msgpack_pack_str(pk, n) | msgpack_pack_str_body(pk, s, n);
}

static int pack_items(msgpack_packer *pk, const wire_pull_item *items, size_t n) {
    int e = pack_str(pk, "mm_hashes") | msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++) e |= pack_str(pk, items[i].mm_hash);
    e |= pack_str(pk, "shapes") | msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++) {
        e |= msgpack_pack_array(pk, items[i].ndim);
        for (uint32_t d = 0; d < items[i].ndim; d++)
            e |= msgpack_pack_uint64(pk, items[i].shape[d]);
    }
    e |= pack_str(pk, "dtype_strs") | msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++) e |= pack_str(pk, items[i].dtype);
    e |= pack_str(pk, "num_bytes_list") | msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++) e |= msgpack_pack_uint64(pk, items[i].num_bytes);
    return e;
}

/* Hands the packed bytes to the caller, or frees them when packing failed. */
static int finish(msgpack_sbuffer *sb, int pack_err, const char *msg, void **out, size_t *out_len) {
    if (pack_err) {
        msgpack_sbuffer_destroy(sb);
        return ect_set_error(ECT_ENOMEM, "%s: out of memory encoding", msg);
    }
    /* The bounds checked above keep every message far below the limit. */
    if (sb->size > WIRE_PULL_MAX_MSG) {
        msgpack_sbuffer_destroy(sb);
        return ect_set_error(ECT_EINVAL, "%s: encodes to more than %u bytes", msg,
                             WIRE_PULL_MAX_MSG);
    }
    *out_len = sb->size;
    *out = msgpack_sbuffer_release(sb);
    return 0;
}

/* The bytes an error text is packed as, so that the decoders accept it
 * whatever the text: at most WIRE_PULL_MAX_STR bytes, cut at a UTF-8
 * boundary, and with every non-ASCII byte made '?' (into ascii) should the
 * cut text still not be UTF-8. */
static const char *error_text(const char *s, char ascii[WIRE_PULL_MAX_STR], size_t *len) {
    size_t n = strlen(s);
    if (n > WIRE_PULL_MAX_STR) {
        n = WIRE_PULL_MAX_STR;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
        if (n == 0) n = WIRE_PULL_MAX_STR; /* no boundary at all: not UTF-8, made ASCII below */
    }
    *len = n;
    if (utf8_valid((const unsigned char *)s, n)) return s;
    for (size_t i = 0; i < n; i++) ascii[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
    return ascii;
}

/* ------------------------------------------- the per-pull messages' packer */

/* ECTransferPull and ECTransferComplete go out once per pull, each way: they
 * are packed here straight into one buffer of their size, in the forms
 * msgpack-c's packer picks (the smallest: fixint / uint8..64, int8..32,
 * fixstr / str8..32, fixmap / map16; test_wire_pull compares the two), not
 * through msgpack_sbuffer's write call per piece and growth checks. */
typedef struct mp_out {
    uint8_t *p;
    size_t len;
} mp_out;

/* Bytes a str of n bytes, and an unsigned, take packed. */
static size_t mp_str_size(size_t n) { return n + (n < 32 ? 1 : n < 256 ? 2 : n < 65536 ? 3 : 5); }
static size_t mp_uint_size(uint64_t v) {
    return v < 128 ? 1 : v < 256 ? 2 : v < 65536 ? 3 : v <= UINT32_MAX ? 5 : 9;
}

/* A tag byte and v big-endian in width bytes. */
static void mp_tagged(mp_out *o, uint8_t tag, uint64_t v, unsigned width) {
    o->p[o->len++] = tag;
    for (unsigned k = width; k-- > 0;) o->p[o->len++] = (uint8_t)(v >> (8 * k));
}

static void mp_map(mp_out *o, uint32_t n) {
    if (n < 16)
        o->p[o->len++] = (uint8_t)(0x80 | n);
    else
        mp_tagged(o, n < 65536 ? 0xde : 0xdf, n, n < 65536 ? 2 : 4);
}

static void mp_uint(mp_out *o, uint64_t v) {
    if (v < 128)
        o->p[o->len++] = (uint8_t)v;
    else if (v < 256)
        mp_tagged(o, 0xcc, v, 1);
    else if (v < 65536)
        mp_tagged(o, 0xcd, v, 2);
    else if (v <= UINT32_MAX)
        mp_tagged(o, 0xce, v, 4);
    else
        mp_tagged(o, 0xcf, v, 8);
}

static void mp_int32(mp_out *o, int32_t v) {
    if (v >= 0)
        mp_uint(o, (uint64_t)v);
    else if (v >= -32)
        o->p[o->len++] = (uint8_t)v;
    else if (v >= -128)
        mp_tagged(o, 0xd0, (uint8_t)v, 1);
    else if (v >= -32768)
        mp_tagged(o, 0xd1, (uint16_t)v, 2);
    else
        mp_tagged(o, 0xd2, (uint32_t)v, 4);
}

static void mp_strn(mp_out *o, const char *s, size_t n) {
    if (n < 32)
        o->p[o->len++] = (uint8_t)(0xa0 | n);
    else if (n < 256)
        mp_tagged(o, 0xd9, n, 1);
    else if (n < 65536)
        mp_tagged(o, 0xda, n, 2);
    else
        mp_tagged(o, 0xdb, n, 4);
    memcpy(o->p + o->len, s, n);
    o->len += n;
}

/* A key (a literal) and a str value of n bytes; their packed size. */
#define KEY(k) (sizeof(k) - 1 + 1)
static size_t mp_kv_str_size(size_t key, size_t n) { return key + mp_str_size(n); }

/* Hands o's bytes (size bytes reserved) to the caller. */
static int mp_finish(mp_out *o, size_t size, const char *msg, void **out, size_t *out_len) {
    /* The bounds checked by the encoders keep every message far below the limit. */
    if (o->len > WIRE_PULL_MAX_MSG || o->len > size) {
        free(o->p);
        return ect_set_error(ECT_EINVAL, "%s: encodes to more than %u bytes", msg,
                             WIRE_PULL_MAX_MSG);
    }
    *out = o->p;
    *out_len = o->len;
    return 0;
}

/* Argument checks shared by the encoders (before validation)... */
#define ENCODE_ARGS(msg)                                                                           \
    if (out) *out = NULL;                                                                          \
    if (out_len) *out_len = 0;                                                                     \
    if (!m || !out || !out_len) return ect_set_error(ECT_EINVAL, "%s: NULL argument", msg)

/* ...and the packer they set up once the message is valid. */
#define PACK_BEGIN()                                                                               \
    msgpack_sbuffer sb;                                                                            \
    msgpack_packer pk;                                                                             \
    msgpack_sbuffer_init(&sb);                                                                     \
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write)

int wire_hash_notification_encode(const wire_hash_notification *m, void **out, size_t *out_len) {
    const char *msg = "ECHashNotification";
    ENCODE_ARGS(msg);
    int rc = check_items(m->items, m->n_items, msg);
    if (!rc) rc = check_cstr(m->producer_session_id, &(fpath){msg, "producer_session_id", -1, -1});
    if (rc) return rc;
    PACK_BEGIN();
    int e = msgpack_pack_map(&pk, ECT_ARRAY_LEN(notif_keys));
    e |= pack_items(&pk, m->items, m->n_items);
    e |= pack_str(&pk, "producer_session_id") | pack_str(&pk, m->producer_session_id);
    return finish(&sb, e, msg, out, out_len);
}

int wire_transfer_pull_encode(const wire_transfer_pull *m, void **out, size_t *out_len) {
    const char *msg = "ECTransferPull";
    ENCODE_ARGS(msg);
    int rc = check_cstr(m->mm_hash, &(fpath){msg, "mm_hash", -1, -1});
    if (!rc) rc = check_cstr(m->consumer_session_id, &(fpath){msg, "consumer_session_id", -1, -1});
    if (!rc && m->dst_key)
        rc = check_text(&(fpath){msg, "dst_key", -1, -1}, ECT_EINVAL, m->dst_key,
                        strlen(m->dst_key), WIRE_PULL_MAX_KEY);
    if (rc) return rc;
    size_t hl = strlen(m->mm_hash), sl = strlen(m->consumer_session_id),
           kl = m->dst_key ? strlen(m->dst_key) : 0;
    size_t size = 1 + mp_kv_str_size(KEY("mm_hash"), hl) + KEY("dst_ptr") +
                  mp_uint_size(m->dst_ptr) + KEY("dst_offset") + mp_uint_size(m->dst_offset) +
                  mp_kv_str_size(KEY("consumer_session_id"), sl) +
                  (m->dst_key ? mp_kv_str_size(KEY("dst_key"), kl) : 0) +
                  (m->has_token ? KEY("token") + mp_uint_size(m->token) : 0);
    mp_out o = {malloc(size), 0};
    if (!o.p) return ect_set_error(ECT_ENOMEM, "%s: out of memory encoding", msg);
    mp_map(&o, (uint32_t)(ECT_ARRAY_LEN(pull_keys) + !!m->dst_key + m->has_token));
    mp_strn(&o, "mm_hash", 7);
    mp_strn(&o, m->mm_hash, hl);
    mp_strn(&o, "dst_ptr", 7);
    mp_uint(&o, m->dst_ptr);
    mp_strn(&o, "dst_offset", 10);
    mp_uint(&o, m->dst_offset);
    mp_strn(&o, "consumer_session_id", 19);
    mp_strn(&o, m->consumer_session_id, sl);
    if (m->dst_key) {
        mp_strn(&o, "dst_key", 7);
        mp_strn(&o, m->dst_key, kl);
    }
    if (m->has_token) {
        mp_strn(&o, "token", 5);
        mp_uint(&o, m->token);
    }
    return mp_finish(&o, size, msg, out, out_len);
}

int wire_transfer_complete_encode(const wire_transfer_complete *m, void **out, size_t *out_len) {
    const char *msg = "ECTransferComplete";
    ENCODE_ARGS(msg);
    int rc = check_cstr(m->mm_hash, &(fpath){msg, "mm_hash", -1, -1});
    if (rc) return rc;
    bool has_error = m->error && m->error[0];
    char ascii[WIRE_PULL_MAX_STR];
    size_t hl = strlen(m->mm_hash), el = 0;
    const char *err = has_error ? error_text(m->error, ascii, &el) : NULL;
    size_t size = 1 + mp_kv_str_size(KEY("mm_hash"), hl) + KEY("status") + 5 +
                  (m->has_token ? KEY("token") + mp_uint_size(m->token) : 0) +
                  (has_error ? mp_kv_str_size(KEY("error"), el) : 0) +
                  (m->shm_id ? mp_kv_str_size(KEY("ect_shm_id"), 16) : 0) +
                  (m->batch_max ? KEY("ect_batch") + mp_uint_size(m->batch_max) : 0);
    if (m->batch_max && (m->batch_max < 2 || m->batch_max > WIRE_PULL_MAX_ITEMS))
        return ferr(&(fpath){msg, "ect_batch", -1, -1}, ECT_EINVAL, "%u is not 2..%d",
                    (unsigned)m->batch_max, WIRE_PULL_MAX_ITEMS);
    mp_out o = {malloc(size), 0};
    if (!o.p) return ect_set_error(ECT_ENOMEM, "%s: out of memory encoding", msg);
    mp_map(&o, (uint32_t)(ECT_ARRAY_LEN(complete_keys) + m->has_token + has_error + !!m->shm_id +
                          !!m->batch_max));
    mp_strn(&o, "mm_hash", 7);
    mp_strn(&o, m->mm_hash, hl);
    mp_strn(&o, "status", 6);
    mp_int32(&o, m->status);
    if (m->has_token) {
        mp_strn(&o, "token", 5);
        mp_uint(&o, m->token);
    }
    if (has_error) {
        mp_strn(&o, "error", 5);
        mp_strn(&o, err, el);
    }
    if (m->shm_id) { /* last: docs/PROTOCOL.md "ectransfer's pull roles" */
        char h[17];
        wctl_shm_id_format(m->shm_id, h);
        mp_strn(&o, "ect_shm_id", 10);
        mp_strn(&o, h, 16);
    }
    if (m->batch_max) {
        mp_strn(&o, "ect_batch", 9);
        mp_uint(&o, m->batch_max);
    }
    return mp_finish(&o, size, msg, out, out_len);
}

int wire_transfer_request_encode(const wire_transfer_request *m, void **out, size_t *out_len) {
    const char *msg = "ECTransferRequest";
    ENCODE_ARGS(msg);
    int rc = check_cstr(m->request_id, &(fpath){msg, "request_id", -1, -1});
    if (!rc) rc = check_cstr(m->consumer_session_id, &(fpath){msg, "consumer_session_id", -1, -1});
    if (!rc && m->n_mm_hashes > WIRE_PULL_MAX_ITEMS)
        rc = ferr(&(fpath){msg, "mm_hashes", -1, -1}, ECT_EINVAL,
                  "list of %zu entries exceeds the bound of %d", m->n_mm_hashes,
                  WIRE_PULL_MAX_ITEMS);
    if (!rc && m->n_mm_hashes && !m->mm_hashes)
        rc = ferr(&(fpath){msg, "mm_hashes", -1, -1}, ECT_EINVAL, "is NULL");
    for (size_t i = 0; i < m->n_mm_hashes && !rc; i++)
        rc = check_cstr(m->mm_hashes[i], &(fpath){msg, "mm_hashes", (long)i, -1});
    if (rc) return rc;
    PACK_BEGIN();
    int e = msgpack_pack_map(&pk, ECT_ARRAY_LEN(request_keys));
    e |= pack_str(&pk, "request_id") | pack_str(&pk, m->request_id);
    e |= pack_str(&pk, "consumer_session_id") | pack_str(&pk, m->consumer_session_id);
    e |= pack_str(&pk, "mm_hashes") | msgpack_pack_array(&pk, m->n_mm_hashes);
    for (size_t i = 0; i < m->n_mm_hashes; i++) e |= pack_str(&pk, m->mm_hashes[i]);
    return finish(&sb, e, msg, out, out_len);
}

int wire_transfer_ready_encode(const wire_transfer_ready *m, void **out, size_t *out_len) {
    const char *msg = "ECTransferReady";
    ENCODE_ARGS(msg);
    int rc = check_cstr(m->request_id, &(fpath){msg, "request_id", -1, -1});
    if (!rc) rc = check_items(m->items, m->n_items, msg);
    if (!rc) rc = check_cstr(m->producer_session_id, &(fpath){msg, "producer_session_id", -1, -1});
    if (rc) return rc;
    PACK_BEGIN();
    int e = msgpack_pack_map(&pk, ECT_ARRAY_LEN(ready_keys));
    e |= pack_str(&pk, "request_id") | pack_str(&pk, m->request_id);
    e |= pack_items(&pk, m->items, m->n_items);
    e |= pack_str(&pk, "producer_session_id") | pack_str(&pk, m->producer_session_id);
    e |= pack_str(&pk, "more") | (m->more ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk));
    return finish(&sb, e, msg, out, out_len);
}

static size_t mp_array_size(size_t n) { return n < 16 ? 1 : n < 65536 ? 3 : 5; }
static void mp_array(mp_out *o, size_t n) {
    if (n < 16)
        o->p[o->len++] = (uint8_t)(0x90 | n);
    else
        mp_tagged(o, n < 65536 ? 0xdc : 0xdd, n, n < 65536 ? 2 : 4);
}

/* The checks of one batch entry against the batch's first. */
static int check_batch_entry(const wire_transfer_pull *p, const wire_transfer_pull *first, long i) {
    const char *msg = "ECTransferPullBatch";
    int rc = check_cstr(p->mm_hash, &(fpath){msg, "ect_pulls", i, 0});
    if (!rc && (!p->dst_key || !p->has_token))
        rc = ferr(&(fpath){msg, "ect_pulls", i, -1}, ECT_EINVAL, "needs dst_key and token");
    if (!rc)
        rc = check_text(&(fpath){msg, "ect_pulls", i, 3}, ECT_EINVAL, p->dst_key,
                        strlen(p->dst_key), WIRE_PULL_MAX_KEY);
    if (!rc && (p->dst_ptr != first->dst_ptr || !p->consumer_session_id ||
                strcmp(p->consumer_session_id, first->consumer_session_id) != 0))
        rc = ferr(&(fpath){msg, "ect_pulls", i, -1}, ECT_EINVAL,
                  "dst_ptr and consumer_session_id differ from the first pull's");
    return rc;
}

int wire_transfer_pull_batch_encode(const wire_transfer_pull_batch *m, void **out,
                                    size_t *out_len) {
    const char *msg = "ECTransferPullBatch";
    ENCODE_ARGS(msg);
    if (m->n == 0 || m->n > WIRE_PULL_MAX_ITEMS || !m->pulls)
        return ferr(&(fpath){msg, "ect_pulls", -1, -1}, ECT_EINVAL, "%zu pulls, expected 1..%d",
                    m->n, WIRE_PULL_MAX_ITEMS);
    const wire_transfer_pull *first = &m->pulls[0];
    int rc = check_cstr(first->consumer_session_id, &(fpath){msg, "consumer_session_id", -1, -1});
    size_t size =
        1 + KEY("ect_pulls") + mp_array_size(m->n) + KEY("ect_dst_ptr") +
        mp_uint_size(first->dst_ptr) +
        (rc ? 0 : mp_kv_str_size(KEY("consumer_session_id"), strlen(first->consumer_session_id)));
    for (size_t i = 0; i < m->n && !rc; i++) {
        const wire_transfer_pull *p = &m->pulls[i];
        rc = check_batch_entry(p, first, (long)i);
        if (!rc)
            size += 1 + mp_str_size(strlen(p->mm_hash)) + mp_uint_size(p->dst_offset) +
                    mp_uint_size(p->token) + mp_str_size(strlen(p->dst_key));
    }
    if (rc) return rc;
    mp_out o = {malloc(size), 0};
    if (!o.p) return ect_set_error(ECT_ENOMEM, "%s: out of memory encoding", msg);
    mp_map(&o, ECT_ARRAY_LEN(batch_keys));
    mp_strn(&o, "ect_pulls", 9);
    mp_array(&o, m->n);
    for (size_t i = 0; i < m->n; i++) {
        const wire_transfer_pull *p = &m->pulls[i];
        mp_array(&o, BATCH_ENTRY_LEN);
        mp_strn(&o, p->mm_hash, strlen(p->mm_hash));
        mp_uint(&o, p->dst_offset);
        mp_uint(&o, p->token);
        mp_strn(&o, p->dst_key, strlen(p->dst_key));
    }
    mp_strn(&o, "ect_dst_ptr", 11);
    mp_uint(&o, first->dst_ptr);
    mp_strn(&o, "consumer_session_id", 19);
    mp_strn(&o, first->consumer_session_id, strlen(first->consumer_session_id));
    return mp_finish(&o, size, msg, out, out_len);
}

int wire_transfer_done_encode(const wire_transfer_done *m, void **out, size_t *out_len) {
    const char *msg = "ECTransferDone";
    ENCODE_ARGS(msg);
    if (m->n == 0 || m->n > WIRE_PULL_MAX_ITEMS || !m->tokens)
        return ferr(&(fpath){msg, "ect_done", -1, -1}, ECT_EINVAL, "%zu tokens, expected 1..%d",
                    m->n, WIRE_PULL_MAX_ITEMS);
    size_t size = 1 + KEY("ect_done") + mp_array_size(m->n);
    for (size_t i = 0; i < m->n; i++) size += mp_uint_size(m->tokens[i]);
    mp_out o = {malloc(size), 0};
    if (!o.p) return ect_set_error(ECT_ENOMEM, "%s: out of memory encoding", msg);
    mp_map(&o, 1);
    mp_strn(&o, "ect_done", 8);
    mp_array(&o, m->n);
    for (size_t i = 0; i < m->n; i++) mp_uint(&o, m->tokens[i]);
    return mp_finish(&o, size, msg, out, out_len);
}

int wire_pull_msg_encode(const wire_pull_msg *m, void **out, size_t *out_len) {
    if (!m) {
        if (out) *out = NULL;
        return ect_set_error(ECT_EINVAL, "pull message: NULL argument");
    }
    switch (m->type) {
    case WIRE_PULL_NOTIFICATION:
        return wire_hash_notification_encode(&m->u.notification, out, out_len);
    case WIRE_PULL_PULL: return wire_transfer_pull_encode(&m->u.pull, out, out_len);
    case WIRE_PULL_COMPLETE: return wire_transfer_complete_encode(&m->u.complete, out, out_len);
    case WIRE_PULL_REQUEST: return wire_transfer_request_encode(&m->u.request, out, out_len);
    case WIRE_PULL_READY: return wire_transfer_ready_encode(&m->u.ready, out, out_len);
    case WIRE_PULL_PULL_BATCH: return wire_transfer_pull_batch_encode(&m->u.batch, out, out_len);
    case WIRE_PULL_DONE: return wire_transfer_done_encode(&m->u.done, out, out_len);
    default:
        if (out) *out = NULL;
        return ect_set_error(ECT_EINVAL, "pull message: unknown type %d", (int)m->type);
    }
}
