/*
 * json_out — the per-item JSON lines `ect push` and `ect push-consumer`
 * print, without jansson in the common case (every string printable ASCII
 * without '"' or '\\'): byte for byte what jansson's compact, order-keeping
 * dump prints for them (tests/unit/test_cli_json_out.c compares the two), at
 * a fraction of the CPU (jansson built, dumped and freed an object per item:
 * ~4 % of `ect demo`'s samples on the producer's side). Any other line goes
 * through jansson as before.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"

bool cli_json_plain(const char *s) {
    for (; *s; s++)
        if (*s < 0x20 || *s > 0x7e || *s == '"' || *s == '\\') return false;
    return true;
}

int cli_json_real(char *buf, size_t cap, double v) {
    /* jansson's jsonp_dtostr at its default precision: "%.17g", ".0" when
     * neither a '.' nor an 'e' came out, no '+' and no leading zeros in the
     * exponent */
    if (!isfinite(v)) return -1;
    int n = snprintf(buf, cap, "%.17g", v);
    if (n < 0 || (size_t)n >= cap) return -1;
    size_t len = (size_t)n;
    if (!strchr(buf, '.') && !strchr(buf, 'e')) {
        if (len + 3 > cap) return -1;
        memcpy(buf + len, ".0", 3);
        len += 2;
    }
    char *e = strchr(buf, 'e');
    if (e) {
        char *start = e + 1, *end = start + 1;
        if (*start == '-') start++;
        while (*end == '0') end++;
        if (end != start) {
            memmove(start, end, len - (size_t)(end - buf) + 1);
            len -= (size_t)(end - start);
        }
    }
    return (int)len;
}

/* How the item ended, the line's "state". */
static const char *push_state(const ect_push_result *r) {
    return r->status == 0 ? "done" : r->status == ECT_ECANCELED ? "cancelled" : "failed";
}

/* The line through jansson (malloc'd; NULL when out of memory). */
static char *push_line_jansson(const cli_push_line *p) {
    json_t *o = json_object();
    char ck[17];
    snprintf(ck, sizeof ck, "%016" PRIx64, p->checksum);
    const ect_push_result *r = p->r;
    json_object_set_new(o, "transfer_id", json_string(p->transfer_id));
    json_object_set_new(o, "mm_hash", json_string(p->mm_hash));
    json_object_set_new(o, "nbytes", json_integer((json_int_t)p->nbytes));
    json_object_set_new(o, "checksum", json_string(ck));
    /* status: "ok" or the error text, as every command says it; state: how
     * the item ended; error: the error text again (kept for older parsers) */
    const char *st = push_state(r);
    json_object_set_new(o, "status", json_string(r->status ? r->error : "ok"));
    json_object_set_new(o, "state", json_string(st));
    if (r->status) json_object_set_new(o, "error", json_string(r->error));
    json_object_set_new(o, "latency_ms", json_real((double)r->latency_ns / 1e6));
    json_object_set_new(o, "shards", json_integer((json_int_t)r->shards));
    json_object_set_new(o, "transport", json_string(r->transport));
    json_object_set_new(o, "retries", json_integer((json_int_t)r->retries));
    char *txt = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return txt;
}

/* The same line printed directly into buf: false when a string needs an
 * escape (or buf is short), the line is then jansson's. */
static bool push_line_direct(const cli_push_line *p, char *buf, size_t cap) {
    const ect_push_result *r = p->r;
    char lat[64];
    if (!cli_json_plain(p->transfer_id) || !cli_json_plain(p->mm_hash) ||
        !cli_json_plain(r->transport) || (r->status && !cli_json_plain(r->error)) ||
        cli_json_real(lat, sizeof lat, (double)r->latency_ns / 1e6) < 0)
        return false;
    const char *st = push_state(r);
    int n = snprintf(
        buf, cap,
        "{\"transfer_id\":\"%s\",\"mm_hash\":\"%s\",\"nbytes\":%lld,\"checksum\":\"%016" PRIx64
        "\",\"status\":\"%s\",\"state\":\"%s\"%s%s%s,\"latency_ms\":%s,\"shards\":%lld,"
        "\"transport\":\"%s\",\"retries\":%lld}",
        p->transfer_id, p->mm_hash, (long long)(json_int_t)p->nbytes, p->checksum,
        r->status ? r->error : "ok", st, r->status ? ",\"error\":\"" : "",
        r->status ? r->error : "", r->status ? "\"" : "", lat, (long long)r->shards, r->transport,
        (long long)r->retries);
    return n > 0 && (size_t)n < cap;
}

void cli_print_push_line(const cli_push_line *p) {
    char buf[2048];
    if (push_line_direct(p, buf, sizeof buf)) {
        puts(buf); /* flushed before every wait (the main loop), not per line */
        return;
    }
    char *txt = push_line_jansson(p);
    if (txt) puts(txt);
    free(txt);
}
