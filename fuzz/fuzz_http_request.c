/*
 * fuzz_http_request — the metrics endpoint's request parser (util/httpreq.c)
 * fed arbitrary bytes, whole and as every prefix a recv() loop would see:
 * it must never read past the bytes given, and a result once HTTP_DONE or
 * refused must not change as more bytes arrive (the server stops reading).
 */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/httpreq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* An exact-size copy, so ASan catches a read past the end. */
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    http_request r, first;
    http_parse_rc settled = HTTP_INCOMPLETE;
    size_t step = size > 64 ? size / 16 : 1;
    for (size_t n = 0; n <= size; n += step) {
        http_parse_rc rc = http_parse_request(buf, n, &r);
        if (settled == HTTP_INCOMPLETE && rc != HTTP_INCOMPLETE) {
            settled = rc;
            first = r;
        } else if (settled != HTTP_INCOMPLETE) {
            assert(rc == settled);
            if (rc == HTTP_DONE) {
                assert(strcmp(r.method, first.method) == 0);
                assert(strcmp(r.path, first.path) == 0);
            }
        }
        if (rc == HTTP_DONE) {
            assert(r.path[0] == '/');
            assert(strlen(r.method) > 0 && strlen(r.method) <= HTTP_METHOD_MAX);
        }
    }
    (void)http_parse_request(buf, size, &r);
    free(buf);
    return 0;
}
