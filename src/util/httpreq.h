/*
 * httpreq — the request parser of the metrics endpoint: an HTTP/1.0 or 1.1
 * request head (request line and headers, no body) read from bytes a peer
 * sent. Pure; bounded by HTTP_MAX_REQUEST; never reads past len.
 */
#ifndef ECT_UTIL_HTTPREQ_H
#define ECT_UTIL_HTTPREQ_H

#include <stddef.h>

#define HTTP_MAX_REQUEST 8192 /* a head longer than this is refused */
#define HTTP_METHOD_MAX 16
#define HTTP_PATH_MAX 1024

typedef enum http_parse_rc {
    HTTP_DONE = 0,       /* a whole head: method and path filled */
    HTTP_INCOMPLETE = 1, /* no end of head yet: read more */
    HTTP_BAD = -1,       /* malformed (answer 400); why says how */
    HTTP_TOO_LARGE = -2, /* no end of head within HTTP_MAX_REQUEST bytes (answer 400) */
} http_parse_rc;

typedef struct http_request {
    char method[HTTP_METHOD_MAX + 1];
    char path[HTTP_PATH_MAX + 1]; /* the target up to '?' */
    int minor;                    /* HTTP/1.minor */
    char why[96];                 /* for HTTP_BAD / HTTP_TOO_LARGE */
} http_request;

/* Parses the head at the start of buf[0..len). Lines end in CRLF or LF. */
http_parse_rc http_parse_request(const char *buf, size_t len, http_request *req);

#endif
