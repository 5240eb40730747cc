/*
 * httpreq — see httpreq.h. The grammar kept is RFC 9112's request line
 * (method SP request-target SP HTTP-version) with an origin-form target,
 * then header fields "name: value" up to an empty line. Header values are
 * not interpreted: the metrics endpoint needs only the method and path.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "util/httpreq.h"

static bool tchar(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static http_parse_rc bad(http_request *req, const char *why) {
    snprintf(req->why, sizeof req->why, "%s", why);
    return HTTP_BAD;
}

/* The end of the line starting at p (the '\n'), or NULL. */
static const char *eol(const char *p, const char *end) {
    const char *q = memchr(p, '\n', (size_t)(end - p));
    return q;
}

http_parse_rc http_parse_request(const char *buf, size_t len, http_request *req) {
    memset(req, 0, sizeof *req);
    size_t lim = len < HTTP_MAX_REQUEST ? len : HTTP_MAX_REQUEST;
    const char *p = buf, *end = buf + lim;
    /* Find the end of the head first: nothing is judged before it is whole,
     * except a request line that is already wrong. */
    const char *nl = eol(p, end);
    if (!nl) {
        if (len >= HTTP_MAX_REQUEST) {
            snprintf(req->why, sizeof req->why, "request head over %d bytes", HTTP_MAX_REQUEST);
            return HTTP_TOO_LARGE;
        }
        return HTTP_INCOMPLETE;
    }
    const char *le = nl > p && nl[-1] == '\r' ? nl - 1 : nl;
    /* method */
    const char *q = p;
    while (q < le && tchar((unsigned char)*q)) q++;
    if (q == p || q >= le || *q != ' ') return bad(req, "bad method");
    if ((size_t)(q - p) > HTTP_METHOD_MAX) return bad(req, "method too long");
    memcpy(req->method, p, (size_t)(q - p));
    /* target */
    const char *t = ++q;
    if (t >= le || *t != '/') return bad(req, "target must start with /");
    while (q < le && (unsigned char)*q > ' ' && (unsigned char)*q < 0x7f) q++;
    if (q >= le || *q != ' ') return bad(req, "bad target");
    const char *qm = memchr(t, '?', (size_t)(q - t));
    const char *pe = qm ? qm : q;
    if ((size_t)(pe - t) > HTTP_PATH_MAX) return bad(req, "path too long");
    memcpy(req->path, t, (size_t)(pe - t));
    /* version */
    q++;
    if (le - q != 8 || memcmp(q, "HTTP/1.", 7) != 0 || (q[7] != '0' && q[7] != '1'))
        return bad(req, "expected HTTP/1.0 or HTTP/1.1");
    req->minor = q[7] - '0';
    /* headers */
    p = nl + 1;
    for (;;) {
        nl = eol(p, end);
        if (!nl) {
            if (len >= HTTP_MAX_REQUEST) {
                snprintf(req->why, sizeof req->why, "request head over %d bytes", HTTP_MAX_REQUEST);
                return HTTP_TOO_LARGE;
            }
            return HTTP_INCOMPLETE;
        }
        le = nl > p && nl[-1] == '\r' ? nl - 1 : nl;
        if (le == p) return HTTP_DONE; /* the empty line */
        q = p;
        while (q < le && tchar((unsigned char)*q)) q++;
        if (q == p || q >= le || *q != ':') return bad(req, "bad header field");
        for (q++; q < le; q++)
            if ((unsigned char)*q < ' ' && *q != '\t') return bad(req, "control byte in header");
        p = nl + 1;
    }
}
