/*
 * fuzz_demo_line — `ect demo`'s reading of its children's JSON lines
 * (src/cli/demo_line.c, compiled in here) against jansson on arbitrary
 * text: a line jansson reads as an object must be accepted, and every one
 * of its top-level keys (and a key it lacks) must read the same string,
 * number and integer as jansson says; any other line must be refused and
 * left exactly as it was.
 * Seeds: fuzz/corpus/demo_line/.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/demo_line.c"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* key reads from l as jansson reads it from o. */
static void same_field(const demo_line *l, json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    const char *s = json_string_value(v);
    CHECK(strcmp(demo_line_str(l, key), s ? s : "") == 0);
    CHECK(demo_line_num(l, key) == json_number_value(v));
    CHECK(demo_line_int(l, key) == (int64_t)json_integer_value(v));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1), *line = malloc(size + 1);
    if (!text || !line) {
        free(text);
        free(line);
        return 0;
    }
    memcpy(text, data, size);
    text[size] = '\0';
    memcpy(line, text, size + 1);
    json_t *o = json_loads(text, 0, NULL);
    if (o && !json_is_object(o)) {
        json_decref(o);
        o = NULL;
    }
    demo_line l;
    bool ok = demo_line_parse(line, &l);
    CHECK(ok == (o != NULL));
    if (ok) {
        const char *key;
        json_t *v;
        json_object_foreach(o, key, v) same_field(&l, o, key);
        same_field(&l, o, "a key no line has");
        demo_line_free(&l);
    } else {
        CHECK(memcmp(line, text, size + 1) == 0);
    }
    json_decref(o);
    free(text);
    free(line);
    return 0;
}
