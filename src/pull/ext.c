/*
 * ext — ectransfer's optional extension keys on the pull messages.
 *
 * ECTransferPull has no field for the destination region's key, and
 * ECTransferComplete none to tell one request from an earlier one for the
 * same mm_hash, so both get extra keys appended after the upstream fields:
 * the upstream encoders always write a fixmap of 4 (pull) or 2 (complete)
 * pairs, so appending means raising the fixmap count and concatenating the
 * packed pairs. Decoders that ignore unknown keys (msgspec, ours) read the
 * rest unchanged.
 */
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "pull/pull_internal.h"
#include "util/util.h"

static int append_pairs(void *base, size_t base_len, unsigned base_pairs, unsigned extra,
                        const msgpack_sbuffer *sb, void **out, size_t *out_len) {
    unsigned char *b = base;
    if (base_len == 0 || b[0] != (0x80u | base_pairs)) {
        unsigned first = base_len ? b[0] : 0;
        free(base);
        return ect_set_error(ECT_EPROTO, "pull ext: unexpected map header 0x%02x", first);
    }
    if (extra == 0) {
        *out = base;
        *out_len = base_len;
        return 0;
    }
    unsigned char *m = realloc(base, base_len + sb->size);
    if (!m) {
        free(base);
        return ect_set_error(ECT_ENOMEM, "pull ext: out of memory");
    }
    m[0] = (unsigned char)(0x80u | (base_pairs + extra));
    memcpy(m + base_len, sb->data, sb->size);
    *out = m;
    *out_len = base_len + sb->size;
    return 0;
}

static void pack_str(msgpack_packer *pk, const char *s, size_t n) {
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_key(msgpack_packer *pk, const char *k) { pack_str(pk, k, strlen(k)); }

int pull_ext_encode_pull(const wire_transfer_pull *m, const pull_ext *x, void **out,
                         size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (x && x->dst_key && (x->dst_key[0] == '\0' || strlen(x->dst_key) >= ECT_XPORT_KEY_MAX))
        return ect_set_error(ECT_EINVAL, "ECTransferPull.dst_key: 1..%d bytes expected",
                             ECT_XPORT_KEY_MAX - 1);
    void *base;
    size_t blen;
    int rc = wire_transfer_pull_encode(m, &base, &blen);
    if (rc) return rc;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    unsigned extra = 0;
    if (x && x->dst_key) {
        pack_key(&pk, "dst_key");
        pack_str(&pk, x->dst_key, strlen(x->dst_key));
        extra++;
    }
    if (x && x->has_token) {
        pack_key(&pk, "token");
        msgpack_pack_uint64(&pk, x->token);
        extra++;
    }
    rc = append_pairs(base, blen, 4, extra, &sb, out, out_len);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

/* Length of the longest prefix of s (at most cap bytes) that ends on a
 * UTF-8 character boundary. */
static size_t utf8_cut(const char *s, size_t cap) {
    size_t n = strlen(s);
    if (n <= cap) return n;
    n = cap;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    return n;
}

int pull_ext_encode_complete(const wire_transfer_complete *m, const pull_ext *x, void **out,
                             size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    void *base;
    size_t blen;
    int rc = wire_transfer_complete_encode(m, &base, &blen);
    if (rc) return rc;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    unsigned extra = 0;
    if (x && x->has_token) {
        pack_key(&pk, "token");
        msgpack_pack_uint64(&pk, x->token);
        extra++;
    }
    if (x && x->error && x->error[0]) {
        pack_key(&pk, "error");
        pack_str(&pk, x->error, utf8_cut(x->error, WIRE_PULL_MAX_STR));
        extra++;
    }
    rc = append_pairs(base, blen, 2, extra, &sb, out, out_len);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

static bool key_is(const msgpack_object *k, const char *name) {
    size_t n = strlen(name);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
           memcmp(k->via.str.ptr, name, n) == 0;
}

static int dup_str(const msgpack_object *v, const char *msg, const char *key, size_t cap,
                   char **out) {
    if (v->type != MSGPACK_OBJECT_STR || v->via.str.size == 0 || v->via.str.size > cap ||
        memchr(v->via.str.ptr, '\0', v->via.str.size))
        return ect_set_error(ECT_EPROTO, "%s.%s: expected str of 1..%zu bytes without NUL", msg,
                             key, cap);
    *out = strndup(v->via.str.ptr, v->via.str.size);
    if (!*out) return ect_set_error(ECT_ENOMEM, "%s.%s: out of memory", msg, key);
    return 0;
}

int pull_ext_decode(const void *buf, size_t len, const char *msg, pull_ext *x) {
    memset(x, 0, sizeof *x);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    if (!buf || msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS ||
        u.data.type != MSGPACK_OBJECT_MAP) {
        msgpack_unpacked_destroy(&u);
        return ect_set_error(ECT_EPROTO, "%s: not a msgpack map", msg);
    }
    int rc = 0;
    const msgpack_object_map *map = &u.data.via.map;
    for (uint32_t i = 0; i < map->size && rc == 0; i++) {
        const msgpack_object *k = &map->ptr[i].key, *v = &map->ptr[i].val;
        if (key_is(k, "dst_key")) {
            if (!x->dst_key) rc = dup_str(v, msg, "dst_key", ECT_XPORT_KEY_MAX - 1, &x->dst_key);
        } else if (key_is(k, "error")) {
            if (!x->error) rc = dup_str(v, msg, "error", WIRE_PULL_MAX_STR, &x->error);
        } else if (key_is(k, "token")) {
            if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
                rc = ect_set_error(ECT_EPROTO, "%s.token: expected int 0..2^64-1", msg);
            else {
                x->has_token = true;
                x->token = v->via.u64;
            }
        }
    }
    msgpack_unpacked_destroy(&u);
    if (rc) pull_ext_free(x);
    return rc;
}

void pull_ext_free(pull_ext *x) {
    if (!x) return;
    free(x->dst_key);
    free(x->error);
    memset(x, 0, sizeof *x);
}
