/*
 * demo_line — the top-level fields of one JSON line a child of `ect demo`
 * printed (ect push, push-consumer, pull, pull-producer: one compact object
 * a line, two lines per item moved). The common line (strings of printable
 * ASCII without escapes, integers of at most 15 digits, reals of at most 24
 * digits and a 2-digit exponent, literals, arrays of such numbers, no key twice) is read in place
 * without allocating: jansson's json_loads, which the demo used for every
 * line, was a third of the demo parent's CPU time (docs/BENCHMARKS.md "The
 * demo's own cost"). Any other line (an escape, UTF-8, a nested object, a
 * repeated key, anything odd) goes to json_loads as before, so every field
 * reads the same either way (fuzz/fuzz_demo_line.c compares the two).
 */
#ifndef ECT_CLI_DEMO_LINE_H
#define ECT_CLI_DEMO_LINE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define DEMO_LINE_MAX_FIELDS 24

typedef struct demo_line {
    json_t *o; /* the fallback's object, or NULL for a line read in place */
    int n;
    const char *key[DEMO_LINE_MAX_FIELDS];
    const char *val[DEMO_LINE_MAX_FIELDS]; /* a string's text, a number's digits */
    char kind[DEMO_LINE_MAX_FIELDS];       /* 's' string, 'n' number, 'o' other */
} demo_line;

/* Reads line (NUL-terminated; written into when read in place). False when
 * it is not one JSON object (nothing to free then). */
bool demo_line_parse(char *line, demo_line *l);
void demo_line_free(demo_line *l);

/* A field's value: the string ("" when absent or not a string), the number
 * (0 when absent or not a number), the integer (0 when absent or not an
 * integer: a number with a fraction or exponent is not), as jansson's
 * json_string_value / json_number_value / json_integer_value say them. */
const char *demo_line_str(const demo_line *l, const char *key);
double demo_line_num(const demo_line *l, const char *key);
int64_t demo_line_int(const demo_line *l, const char *key);

#endif
